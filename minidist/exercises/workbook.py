"""The workbook's Build and Debug exercises: its calculators, in Python.

Workbook 0.5 ringAllReduceTime, 0.6 the all-reduce time that is 2x too large,
2.4 effectiveBatch / requiredAccumSteps and 4.5 commComputeRatio (chapters 5-8
are in workbook_5_8.py). Each is graded against ``minidist.calc`` (the oracle), on
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
    id="0.5", title="implement ring_all_reduce_time_ms()", kind="implement",
    filename="ex_0_5_ring_all_reduce_time.py",
    docs="docs/cost_models.md; workbook chapter 0",
    starter='''"""Workbook 0.5: implement ring_all_reduce_time_ms().

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
                 hint="each of the 2(N-1) steps moves M/N bytes; docs/cost_models.md, T_ring"),
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
    id="2.4", title="implement effective_batch() and required_accum_steps()", kind="implement",
    filename="ex_2_4_effective_batch.py",
    docs="docs/ddp.md (gradient accumulation); workbook chapter 2",
    starter='''"""Workbook 2.4: implement effective_batch() and required_accum_steps().

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
                 hint="every rank runs accum_steps micro-batches per step; docs/cost_models.md"),
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
    id="4.5", title="implement comm_compute_ratio()", kind="implement",
    filename="ex_4_5_comm_compute_ratio.py",
    docs="docs/cost_models.md (communication overhead); workbook chapter 4",
    starter='''"""Workbook 4.5: implement comm_compute_ratio().

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


EXERCISES = [RING_TIME, ALL_REDUCE_BUG, EFFECTIVE_BATCH, COMM_COMPUTE]
