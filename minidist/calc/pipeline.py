"""Pipeline-parallel cost models: bubble, in-flight activations, point-to-point volume.

Notation (workbook ch. 5): p pipeline stages, m micro-batches per step, v virtual
stages (model chunks) per GPU for the interleaved schedule. The source documents
use N for p and M for m in chapter 26 and the quiz.

With equal stages, every schedule leaves each stage idle for p-1 fill/drain
slots (v times shorter slots when interleaved). One quantity, two denominators,
each function keeping one for every schedule:

                 bubble_fraction            idle_fraction
                 idle / ideal compute       idle / total step time
    GPipe        (p-1) / m                  (p-1) / (m + p-1)
    1F1B         (p-1) / m                  (p-1) / (m + p-1)
    interleaved  (p-1) / (m v)              (p-1) / (m v + p-1)

``bubble_fraction`` is Narayanan et al. 2021's bubble time fraction (section
2.2: t_pb / t_id = (p-1)/m for GPipe and 1F1B, (p-1)/(v m) interleaved); it
can exceed 100% (workbook 9.6: 375%). ``idle_fraction`` is the share of the
step's wall clock a stage idles, x / (1 + x) of the first. GPipe and 1F1B idle
for exactly the same time; 1F1B's gain is memory (p micro-batches in flight
instead of m). Some source documents quote GPipe's bubble as idle / total,
(p-1)/(m+p-1) (worked solutions: p = m = 8 -> 47%): that is ``idle_fraction``.
Zero-bubble schedules (B/W split) add their own rows here when they exist.
"""
from __future__ import annotations

from fractions import Fraction

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _check(stages: int, microbatches: int, virtual_stages: int) -> None:
    if stages < 1 or microbatches < 1 or virtual_stages < 1:
        raise ValueError("stages, microbatches and virtual_stages must be >= 1, got "
                         f"{stages}, {microbatches}, {virtual_stages}")


def _idle_over_ideal(stages: int, microbatches: int, schedule: str,
                     virtual_stages: int) -> Fraction:
    """The bubble of one schedule as an exact fraction: idle slots / ideal slots."""
    _check(stages, microbatches, virtual_stages)
    if schedule in ("gpipe", "1f1b"):
        return Fraction(stages - 1, microbatches)
    if schedule == "interleaved":
        return Fraction(stages - 1, microbatches * virtual_stages)
    if schedule in ZERO_BUBBLE:
        return zero_bubble_fraction(stages, microbatches, schedule)
    raise ValueError(f"unknown schedule {schedule!r}: one of {SCHEDULES + ZERO_BUBBLE}")


ZERO_BUBBLE = ("zb_h1", "zb_h2", "zb_v")


def zero_bubble_fraction(stages: int, microbatches: int, schedule: str) -> Fraction:
    """Bubble (idle / ideal compute) of the zero-bubble schedules, T_F = T_B = T_W.

    Qi et al., ICLR 2024, table 1: ZB-H1 leaves (p-1)(T_F + T_B - T_W) of idle
    per stage against m (T_F + T_B + T_W) of work: (p-1)/(3m), a third of
    1F1B's, once m >= p. ZB-H2 (m >= 2p-1) and ZB-V (m >= 2p) leave none:
    0. Below those m the warm-up cannot be filled and no formula is given.
    """
    _check(stages, microbatches, 1)
    need = {"zb_h1": stages, "zb_h2": 2 * stages - 1, "zb_v": 2 * stages}[schedule]
    if microbatches < need:
        raise ValueError(f"the {schedule} bubble formula needs m >= {need} for p = {stages}, "
                         f"got m = {microbatches} (minidist.parallel.pipeline.simulate "
                         "gives the bubble for any m)")
    if schedule == "zb_h1":
        return Fraction(stages - 1, 3 * microbatches)
    return Fraction(0)


def dualpipe_v_idle(stages: int, forward: float, backward: float, weight: float,
                    overlapped: float | None = None) -> float:
    """DualPipeV's bubble as the DualPipe README gives it: idle time of the busiest
    of p ranks (PP = 2p pipeline stages) over a step, (PP/2 - 1)(F&B + B - 3W).

    forward F, backward B (a full backward), weight W (its weight part) and
    overlapped F&B (a forward and a backward run as one op; F + B when None) are
    the costs of one chunk (half a rank's layers). The README's table is drawn
    for F = W = B/2 (its figure: F one cell, B two, W one); on the ideal clock
    the formula is exact when

        2B = F + 3W                         B's input half is the mean of F and W
        (p-1)/(p+1) <= F/W <= (p+1)/(p-1)   F and W not too far apart
        F&B >= B + max(0, (p-1)(F - W)/2)   the overlap saves at most F - (p-1)(F-W)/2

    (then it is the last rank's chain, ``dualpipe_v_exact_idle``'s
    (p-1)(F + F&B - B)). Elsewhere ``dualpipe_v_exact_idle`` gives the idle
    time. For 1F1B the README's row is (PP - 1)(F + B), for ZB1P (PP - 1)(F + B - 2W)."""
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    both = forward + backward if overlapped is None else overlapped
    return (stages - 1) * (both + backward - 3 * weight)


def dualpipe_v_exact_idle(stages: int, forward: float, backward: float, weight: float,
                          overlapped: float | None = None) -> float:
    """The idle time of DualPipeV's busiest rank on the ideal clock, for any chunk
    costs F, B (full backward), W <= B and max(F, B) <= F&B <= F + B (F + B when None).

    With I = B - W (the input-gradient half), the step's span is the longest path
    through the ops' dependencies, a maximum of linear forms in the costs; less the
    least busy rank's work, six of them remain, and the largest is the bubble:

        (p-1)(F + F&B - B)              the last rank: (p-1) F waiting for its first
                                        forward, (p-1)(F&B - B) in its drain
        (p-1)(F + F&B) - (2p-1) W
        (p-1)(F&B - W) - F
        (p-1)(F&B + B - 3W) - F - W     the README's formula less F + W
        p I - F - (2p-3) W + (p-2) F&B
        (p-1) F + I - (2p-3) W + (p-2) F&B

    (found by differentiating the simulated span in each cost, and checked against
    the simulator, pipeline.schedule.simulate, on hypothesis-drawn costs for
    p = 2-5 and m >= 2p: tests/parallel/pipeline/test_dualpipe.py). At 2B = F + 3W
    the first is the README's (p-1)(F&B + B - 3W) (``dualpipe_v_idle``).
    Independent of m."""
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if stages == 1:
        return 0.0                    # one rank: both chunks back to back, nothing to wait for
    p, f, w = stages, forward, weight
    i = backward - weight
    fb = forward + backward if overlapped is None else overlapped
    chains = (
        (p - 1) * (f + fb - backward),
        (p - 1) * (f + fb) - (2 * p - 1) * w,
        (p - 1) * (fb - w) - f,
        (p - 1) * (fb + backward - 3 * w) - f - w,
        p * i - f - (2 * p - 3) * w + (p - 2) * fb,
        (p - 1) * f + i - (2 * p - 3) * w + (p - 2) * fb,
    )
    return max(chains)


def bubble_fraction(stages: int, microbatches: int, schedule: str = "1f1b",
                    virtual_stages: int = 1) -> float:
    """Pipeline bubble as idle time over ideal compute time, for every schedule.

    gpipe and 1f1b: (p-1)/m (workbook 5.1: 3/12 = 25%); interleaved: (p-1)/(m v)
    (workbook 5.3: 3/48 = 6.25%). Narayanan et al. 2021, section 2.2. For the
    share of the step's wall clock, see ``idle_fraction``.
    """
    return float(_idle_over_ideal(stages, microbatches, schedule, virtual_stages))


def idle_fraction(stages: int, microbatches: int, schedule: str = "1f1b",
                  virtual_stages: int = 1) -> float:
    """Share of the step's wall-clock time a stage is idle: idle / (idle + ideal).

    (p-1) / (m v + p-1), v = 1 unless interleaved: bubble_fraction x turned
    into x / (1 + x). Worked solutions: GPipe, p = m = 8 -> 47%; quiz Q5:
    4 stages, 16 micro-batches -> 16%; workbook 9.6's 375% bubble is 79% idle.
    """
    x = _idle_over_ideal(stages, microbatches, schedule, virtual_stages)
    return float(x / (1 + x))


def min_microbatches(stages: int, max_bubble: float, schedule: str = "1f1b",
                     virtual_stages: int = 1) -> int:
    """Smallest m whose bubble_fraction (idle / ideal) is strictly below max_bubble.

    (p-1)/(m v) < b  <=>  m > (p-1)/(b v). Workbook 5.6: p = 8, 5% -> 141.
    The target is turned into an exact fraction first (0.05 -> 1/20): in binary
    0.05 is a hair above 1/20, which would let 7/140 = 5% count as "below 5%".
    """
    target = Fraction(max_bubble).limit_denominator(10**9)
    if not 0 < target < 1:
        raise ValueError(f"max_bubble must be in (0, 1), got {max_bubble}")
    m = 1
    # bubble_fraction decreases in m, so walk up (a few thousand steps at most
    # for any sensible target; exact Fractions avoid a rounding at the boundary)
    while _idle_over_ideal(stages, m, schedule, virtual_stages) >= target:
        m += 1
    return m


def warmup_forwards(stages: int, stage: int = 0) -> int:
    """Forward passes a stage runs before its first backward in 1F1B: p - stage - 1.

    The workbook's "p-1 in-flight micro-batches" (ch. 5, ex. 5.2) is this count
    for the first stage.
    """
    return stages - stage - 1


def peak_inflight_microbatches(stages: int, microbatches: int, schedule: str = "1f1b",
                               stage: int = 0) -> int:
    """Most micro-batches whose activations a stage holds at once.

    GPipe runs every forward before any backward: m. 1F1B: the p - stage - 1
    warmup forwards, plus the steady-state forward that comes just before the
    stage's first backward: min(m, p - stage). The first stage holds the most, p.
    Workbook ch. 5 and 5.2 (GPipe "stashes all m=12"); chapter 26 ex. 26.6(c).
    (Interleaved schedules hold chunks of 1/v of a stage; no formula is given
    for them in the source documents, so none is given here.)
    """
    _check(stages, microbatches, 1)
    if schedule == "gpipe":
        return microbatches
    if schedule == "1f1b":
        return min(microbatches, stages - stage)
    raise ValueError(f"peak in-flight is modelled for 'gpipe' and '1f1b', not {schedule!r}")


def pipeline_activation_memory(activation_bytes: float, stages: int, microbatches: int,
                               schedule: str = "1f1b", stage: int = 0) -> float:
    """Peak activation bytes on one stage: in-flight micro-batches x bytes per micro-batch.

    activation_bytes is one micro-batch's activations for this stage's layers.
    Workbook 5.2: GPipe, m = 12, 2 GB -> 24 GB; 1F1B, p = 4 -> 4 x 2 = 8 GB.
    Chapter 26 ex. 26.6(c) asks for this as a function of m and N.
    """
    return activation_bytes * peak_inflight_microbatches(stages, microbatches, schedule, stage)


def p2p_volume(activation_bytes: float, stages: int, microbatches: int,
               virtual_stages: int = 1) -> float:
    """Point-to-point bytes per step, summed over all stage boundaries.

    (p v - 1) boundaries x m micro-batches x 2 (activations forward, their
    gradients backward) x activation_bytes. Interleaving multiplies the
    boundaries by v. Workbook 5.4: 15 x 12 x (0.5 + 0.5) GB = 180 GB.
    """
    _check(stages, microbatches, virtual_stages)
    boundaries = stages * virtual_stages - 1
    return boundaries * microbatches * 2 * activation_bytes


def layers_per_stage(layers: int, stages: int) -> list[int]:
    """Layers on each stage when L does not divide evenly: L mod p stages get one more.

    Returned largest first. Workbook 9.2: 126 layers on 16 stages -> 14 stages of 8
    and 2 of 7 (14 x 8 + 2 x 7 = 126). Real runs put the short stages first and
    last, where the embedding and the LM head also live.
    """
    if stages < 1 or layers < stages:
        raise ValueError(f"need 1 <= stages <= layers, got {stages} stages, {layers} layers")
    base, extra = divmod(layers, stages)
    return [base + 1] * extra + [base] * (stages - extra)
