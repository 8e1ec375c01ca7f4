"""The workbook's Build and Debug exercises: its calculators, in Python.

Workbook 0.5 ringAllReduceTime, 0.6 the all-reduce time that is 2x too large,
2.4 effectiveBatch / requiredAccumSteps, 4.5 commComputeRatio, 5.5 the bubble
fraction that uses GPipe's denominator, 7.5 optimalCheckpointInterval and 8.6
dynamicLossScale. Each is graded against ``minidist.calc`` (the oracle), on
inputs hypothesis draws. Units are the workbook's (GB, GB/s, microseconds,
milliseconds, hours), as in its JavaScript.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from minidist import calc
from minidist.exercises.core import Exercise, Property

ranks = st.integers(2, 4096)         # a ring of one rank sends nothing: no counterexample to learn from
sizes_gb = st.floats(0.001, 1000.0)
bandwidths = st.floats(1.0, 2000.0)


def _close(got: float, want: float, what: str, rel: float = 1e-9) -> None:
    assert isinstance(got, (int, float)), f"{what}: expected a number, got {type(got).__name__}"
    assert math.isclose(got, want, rel_tol=rel, abs_tol=1e-12), \
        f"{what}: got {got!r}, expected {want!r}" + (f" (ratio {got / want:.4g})" if want else "")


# -- 0.5 ringAllReduceTime ------------------------------------------------------------

def _ring_time_matches(s, m_gb, n, bw_gbs, latency_us):
    want = calc.ring_all_reduce_time(m_gb * 1e9, n, bw_gbs * 1e9, latency_us * 1e-6) * 1e3
    _close(s.ring_all_reduce_time_ms(m_gb, n, bw_gbs, latency_us), want, "time (ms)")


def _ring_time_worked(s):
    _close(s.ring_all_reduce_time_ms(2.0, 8, 50.0, 0.0), 70.0, "workbook 0.2: 2 GB, 8 GPUs, 50 GB/s")


RING_TIME = Exercise(
    id="0.5", title="implement ringAllReduceTime()", kind="implement",
    filename="ex_0_5_ring_all_reduce_time.py",
    docs="docs/cost_models.md; workbook chapter 0",
    starter='''"""Workbook 0.5: implement ringAllReduceTime().

Write a function that computes the ring all-reduce time in milliseconds,
including both the bandwidth and the latency terms.

    2(N-1) steps (N-1 reduce-scatter, N-1 all-gather), each moving M/N bytes
    T = steps x (M/N) / BW  +  steps x latency

Interface: plain arithmetic; M in GB, BW in GB/s, latency in microseconds.
Check it with `minidist exercise check 0.5`.
"""


def ring_all_reduce_time_ms(m_gb: float, n: int, bw_gbs: float, latency_us: float) -> float:
    """Milliseconds for a ring all-reduce of m_gb GB over n GPUs."""
    raise NotImplementedError
''',
    properties=[
        Property("workbook 0.2's number: 2 GB on 8 GPUs at 50 GB/s is 70 ms", _ring_time_worked,
                 hint="workbook chapter 0, 'Data transferred per GPU'; docs/cost_models.md"),
        Property("equals 2(N-1) x (M/N)/BW + 2(N-1) x latency for any M, N, BW, latency",
                 _ring_time_matches,
                 dict(m_gb=sizes_gb, n=ranks, bw_gbs=bandwidths, latency_us=st.floats(0, 100)),
                 hint="count the steps of both phases, and convert us -> ms and s -> ms"),
    ],
    solution='''from minidist import calc


def ring_all_reduce_time_ms(m_gb, n, bw_gbs, latency_us):
    return calc.ring_all_reduce_time(m_gb * 1e9, n, bw_gbs * 1e9, latency_us * 1e-6) * 1e3
''',
    wrong={
        "one phase only": '''def ring_all_reduce_time_ms(m_gb, n, bw_gbs, latency_us):
    steps = n - 1
    return steps * (m_gb / n) / bw_gbs * 1e3 + steps * latency_us / 1e3
''',
        "latency counted once": '''def ring_all_reduce_time_ms(m_gb, n, bw_gbs, latency_us):
    steps = 2 * (n - 1)
    return steps * (m_gb / n) / bw_gbs * 1e3 + latency_us / 1e3
''',
    })


# -- 0.6 find the bug: 2x too large ------------------------------------------------------

def _all_reduce_time_matches(s, m, n, bw):
    _close(s.all_reduce_time(m, n, bw), calc.ring_all_reduce_time(m, n, bw), "time")


ALL_REDUCE_BUG = Exercise(
    id="0.6", title="find the bug: an all-reduce time 2x too large", kind="debug",
    filename="ex_0_6_find_the_bug.py",
    docs="docs/cost_models.md; workbook chapter 0",
    starter='''"""Workbook 0.6: find the bug.

This all-reduce time calculator returns values that are 2x too large. Find
the line, fix it, and run `minidist exercise check 0.6`.

    T = 2M(N-1)/N / BW     (ring all-reduce, bandwidth term only)
"""


def all_reduce_time(m: float, n: int, bw: float) -> float:
    """Seconds for a ring all-reduce of m bytes over n ranks at bw bytes/s."""
    data_per_gpu = 2 * m * (n - 1) / n
    steps = 2 * (n - 1)
    per_step_data = m / n
    per_step_time = per_step_data / bw
    total_time = 2 * steps * per_step_time
    return total_time
''',
    properties=[
        Property("equals 2M(N-1)/N / BW", _all_reduce_time_matches,
                 dict(m=st.floats(1.0, 1e12), n=st.integers(2, 1024), bw=st.floats(1e6, 1e12)),
                 hint="how many phases does `steps` already count? (workbook chapter 0)"),
    ],
    solution='''from minidist import calc


def all_reduce_time(m, n, bw):
    return calc.ring_all_reduce_time(m, n, bw)
''',
    wrong={
        "the planted bug": "",   # the starter itself
        "one phase": '''def all_reduce_time(m, n, bw):
    return m * (n - 1) / n / bw
''',
    })


# -- 2.4 effectiveBatch ------------------------------------------------------------------

def _effective_batch(s, micro, steps, dp):
    assert s.effective_batch(micro, steps, dp) == calc.effective_batch(micro, steps, dp), \
        f"effective_batch({micro}, {steps}, {dp}) = {s.effective_batch(micro, steps, dp)}"


def _required_steps(s, target, micro, dp):
    got = s.required_accum_steps(target, micro, dp)
    want = calc.accumulation_steps(target, micro, dp)
    assert got == want, f"required_accum_steps({target}, {micro}, {dp}) = {got}, expected {want}"
    assert s.effective_batch(micro, got, dp) >= target, "the batch reached is below the target"


EFFECTIVE_BATCH = Exercise(
    id="2.4", title="implement effectiveBatch()", kind="implement",
    filename="ex_2_4_effective_batch.py",
    docs="docs/ddp.md (gradient accumulation); workbook chapter 2",
    starter='''"""Workbook 2.4: implement effectiveBatch().

Compute the effective batch from the micro-batch, the accumulation steps and
the data-parallel degree, and the accumulation steps needed for a target.

    B_eff = micro_batch x accum_steps x DP

The steps must reach at least the target batch (a whole number of steps).
"""


def effective_batch(micro_batch: int, accum_steps: int, dp_degree: int) -> int:
    raise NotImplementedError


def required_accum_steps(target_batch: int, micro_batch: int, dp_degree: int) -> int:
    raise NotImplementedError
''',
    properties=[
        Property("B_eff = micro x steps x DP", _effective_batch,
                 dict(micro=st.integers(1, 64), steps=st.integers(1, 256), dp=st.integers(1, 4096)),
                 hint="workbook chapter 2, 'Effective batch size'"),
        Property("the fewest whole steps that reach the target", _required_steps,
                 dict(target=st.integers(1, 100000), micro=st.integers(1, 64), dp=st.integers(1, 512)),
                 hint="a target that is not a multiple needs one more step: round up"),
    ],
    solution='''from minidist import calc


def effective_batch(micro_batch, accum_steps, dp_degree):
    return calc.effective_batch(micro_batch, accum_steps, dp_degree)


def required_accum_steps(target_batch, micro_batch, dp_degree):
    return calc.accumulation_steps(target_batch, micro_batch, dp_degree)
''',
    wrong={
        "floor division": '''def effective_batch(micro_batch, accum_steps, dp_degree):
    return micro_batch * accum_steps * dp_degree


def required_accum_steps(target_batch, micro_batch, dp_degree):
    return target_batch // (micro_batch * dp_degree)
''',
        "DP forgotten": '''import math


def effective_batch(micro_batch, accum_steps, dp_degree):
    return micro_batch * accum_steps


def required_accum_steps(target_batch, micro_batch, dp_degree):
    return math.ceil(target_batch / micro_batch)
''',
    })


# -- 4.5 commComputeRatio ----------------------------------------------------------------

def _ratio_matches(s, params_b, n, bw_gbs, flops_t, tflops):
    want = calc.dp_comm_compute_ratio(params_b * 1e9, n, bw_gbs * 1e9, flops_t * 1e12, tflops * 1e12)
    _close(s.comm_compute_ratio(params_b, n, bw_gbs, flops_t, tflops), want, "ratio")


COMM_COMPUTE = Exercise(
    id="4.5", title="implement commComputeRatio()", kind="implement",
    filename="ex_4_5_comm_compute_ratio.py",
    docs="docs/cost_models.md (communication overhead); workbook chapter 4",
    starter='''"""Workbook 4.5: implement commComputeRatio().

Given model and cluster parameters, compute the communication-to-compute
ratio of one data-parallel step (no overlap, no latency):

    S = params x 2 bytes           (FP16 gradients)
    T_comm = 2 S (N-1) / (N BW)     (ring all-reduce)
    T_compute = step FLOPs / GPU FLOP/s

Units: params in billions, BW in GB/s, FLOPs in TFLOP, GPU speed in TFLOP/s.
"""


def comm_compute_ratio(params_b: float, n: int, bw_gbs: float, flops_per_step_t: float,
                       gpu_tflops: float) -> float:
    raise NotImplementedError
''',
    properties=[
        Property("T_comm / T_compute for any model and cluster", _ratio_matches,
                 dict(params_b=st.floats(0.1, 1000), n=st.integers(1, 4096), bw_gbs=bandwidths,
                      flops_t=st.floats(1, 1e6), tflops=st.floats(10, 2000)),
                 hint="workbook chapter 4; the gradient is in FP16 and the ring moves 2(N-1)/N of it"),
    ],
    solution='''from minidist import calc


def comm_compute_ratio(params_b, n, bw_gbs, flops_per_step_t, gpu_tflops):
    return calc.dp_comm_compute_ratio(params_b * 1e9, n, bw_gbs * 1e9,
                                      flops_per_step_t * 1e12, gpu_tflops * 1e12)
''',
    wrong={
        "fp32 gradients": '''def comm_compute_ratio(params_b, n, bw_gbs, flops_per_step_t, gpu_tflops):
    s = params_b * 4
    return (2 * s * (n - 1) / (n * bw_gbs)) / (flops_per_step_t / gpu_tflops)
''',
        "one way only": '''def comm_compute_ratio(params_b, n, bw_gbs, flops_per_step_t, gpu_tflops):
    s = params_b * 2
    return (s * (n - 1) / (n * bw_gbs)) / (flops_per_step_t / gpu_tflops)
''',
    })


# -- 5.5 find the bug: the bubble ------------------------------------------------------

def _bubble_matches(s, pp, m, v):
    want = calc.bubble_fraction(pp, m, "interleaved" if v > 1 else "1f1b", v)
    _close(s.bubble_fraction(pp, m, v), want, "bubble fraction")


BUBBLE_BUG = Exercise(
    id="5.5", title="find the bug: the 1F1B bubble fraction", kind="debug",
    filename="ex_5_5_find_the_bug.py",
    docs="docs/pipeline.md; workbook chapter 5",
    starter='''"""Workbook 5.5: find the bug.

This bubble fraction calculator for 1F1B (and interleaved 1F1B with
virtual_stages > 1) has a subtle error. Fix it and run
`minidist exercise check 5.5`.

    1F1B:        bubble = (p - 1) / m
    interleaved: bubble = (p - 1) / (m v)
"""


def bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    bubble_steps = pp - 1
    total_steps = microbatches * virtual_stages
    return bubble_steps / (bubble_steps + total_steps)
''',
    properties=[
        Property("equals (p-1)/(m v)", _bubble_matches,
                 dict(pp=st.integers(1, 64), m=st.integers(1, 512), v=st.integers(1, 8)),
                 hint="which schedule has (p-1) in its denominator? (workbook chapter 5)"),
    ],
    solution='''from minidist import calc


def bubble_fraction(pp, microbatches, virtual_stages=1):
    schedule = "interleaved" if virtual_stages > 1 else "1f1b"
    return calc.bubble_fraction(pp, microbatches, schedule, virtual_stages)
''',
    wrong={
        "the planted bug": "",
        "v forgotten": '''def bubble_fraction(pp, microbatches, virtual_stages=1):
    return (pp - 1) / microbatches
''',
    })


# -- 7.5 optimalCheckpointInterval ------------------------------------------------------

def _interval_matches(s, mtbf_h, ckpt_s):
    got = s.optimal_checkpoint_interval(mtbf_h, ckpt_s)
    assert len(got) == 2, f"return (interval in minutes, waste in percent), got {got!r}"
    tau = calc.young_interval(ckpt_s, mtbf_h * 3600)
    _close(got[0], tau / 60, "interval (minutes)")
    _close(got[1], 100 * calc.expected_waste_fraction(tau, ckpt_s, mtbf_h * 3600), "waste (%)")


CHECKPOINT_INTERVAL = Exercise(
    id="7.5", title="implement optimalCheckpointInterval()", kind="implement",
    filename="ex_7_5_checkpoint_interval.py",
    docs="docs/checkpoints.md; workbook chapter 7",
    starter='''"""Workbook 7.5: implement optimalCheckpointInterval().

Given the MTBF and the time to write a checkpoint, return Young's optimal
interval and the expected waste:

    tau = sqrt(2 C F)                          (C checkpoint time, F MTBF)
    waste = (tau / 2 + C F / tau) / F          (lost work + writing, per MTBF)

Return (interval in minutes, waste in percent).
"""


def optimal_checkpoint_interval(mtbf_hours: float, ckpt_seconds: float) -> tuple[float, float]:
    raise NotImplementedError
''',
    properties=[
        Property("Young's interval and the waste it leaves", _interval_matches,
                 dict(mtbf_h=st.floats(0.5, 10000), ckpt_s=st.floats(1, 3600)),
                 hint="workbook chapter 7; keep C and F in the same unit before the sqrt"),
    ],
    solution='''from minidist import calc


def optimal_checkpoint_interval(mtbf_hours, ckpt_seconds):
    tau = calc.young_interval(ckpt_seconds, mtbf_hours * 3600)
    waste = calc.expected_waste_fraction(tau, ckpt_seconds, mtbf_hours * 3600)
    return tau / 60, 100 * waste
''',
    wrong={
        "mixed units": '''import math


def optimal_checkpoint_interval(mtbf_hours, ckpt_seconds):
    tau = math.sqrt(2 * ckpt_seconds * mtbf_hours)       # seconds x hours
    return tau * 60, 100 * (tau / 2 + ckpt_seconds / 3600 * mtbf_hours / tau) / mtbf_hours
''',
        "waste without the lost half-interval": '''import math


def optimal_checkpoint_interval(mtbf_hours, ckpt_seconds):
    c = ckpt_seconds / 3600
    tau = math.sqrt(2 * c * mtbf_hours)
    return tau * 60, 100 * (c * mtbf_hours / tau) / mtbf_hours
''',
    })


# -- 8.6 dynamicLossScale --------------------------------------------------------------

def _loss_scale_matches(s, steps, init_log2, interval):
    init = 2.0 ** init_log2
    want = calc.dynamic_loss_scale(steps, init, interval)
    got = s.dynamic_loss_scale(list(steps), init, interval)
    assert got == want, f"scale after {len(steps)} steps = {got!r}, expected {want!r}"


def _loss_scale_worked(s):
    got = s.dynamic_loss_scale([False, True, False, True, False], 65536.0, 2000)
    assert got == 16384.0, f"workbook 8.2: overflows at steps 2 and 4 -> 16384, got {got!r}"


LOSS_SCALE = Exercise(
    id="8.6", title="implement dynamicLossScale()", kind="implement",
    filename="ex_8_6_dynamic_loss_scale.py",
    docs="docs/precision.md (loss scaling); workbook chapter 8",
    starter='''"""Workbook 8.6: implement dynamicLossScale().

Simulate the dynamic loss scaling protocol over a list of step results
(True = the gradients overflowed):

    overflow: skip the step, S = S / 2, and the count of good steps restarts
    else: one more good step; after grow_interval good steps in a row, S = 2 S
          (and the count restarts)

Return the final scale.
"""


def dynamic_loss_scale(steps: list[bool], init_scale: float, grow_interval: int) -> float:
    raise NotImplementedError
''',
    properties=[
        Property("workbook 8.2: 65536, overflows at steps 2 and 4 of 5 -> 16384", _loss_scale_worked,
                 hint="workbook chapter 8, 'Dynamic loss scaling protocol'"),
        Property("halves on overflow, doubles after grow_interval good steps in a row",
                 _loss_scale_matches,
                 dict(steps=st.lists(st.booleans(), max_size=40), init_log2=st.integers(0, 24),
                      interval=st.integers(1, 6)), examples=60,
                 hint="what happens to the count of good steps after an overflow, and after a growth?"),
    ],
    solution='''from minidist import calc


def dynamic_loss_scale(steps, init_scale, grow_interval):
    return calc.dynamic_loss_scale(steps, init_scale, grow_interval)
''',
    wrong={
        "count not reset on overflow": '''def dynamic_loss_scale(steps, init_scale, grow_interval):
    scale, good = init_scale, 0
    for overflow in steps:
        if overflow:
            scale /= 2
        else:
            good += 1
            if good >= grow_interval:
                scale *= 2
                good = 0
    return scale
''',
        "count not reset on growth": '''def dynamic_loss_scale(steps, init_scale, grow_interval):
    scale, good = init_scale, 0
    for overflow in steps:
        if overflow:
            scale /= 2
            good = 0
        else:
            good += 1
            if good >= grow_interval:
                scale *= 2
    return scale
''',
    })

EXERCISES = [RING_TIME, ALL_REDUCE_BUG, EFFECTIVE_BATCH, COMM_COMPUTE, BUBBLE_BUG,
             CHECKPOINT_INTERVAL, LOSS_SCALE]
