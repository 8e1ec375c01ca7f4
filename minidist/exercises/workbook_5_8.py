"""The workbook's Build and Debug exercises of chapters 5-8: its calculators, in Python.

Workbook 5.5 the bubble fraction that uses GPipe's denominator, 7.5
optimalCheckpointInterval and 8.6 dynamicLossScale, graded against
``minidist.calc`` like those of workbook.py (chapters 0-4).
"""
from __future__ import annotations

from hypothesis import strategies as st

from minidist import calc
from minidist.exercises.core import Exercise, Property
from minidist.exercises.workbook import _close


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
    id="7.5", title="implement optimal_checkpoint_interval()", kind="implement",
    filename="ex_7_5_checkpoint_interval.py",
    docs="docs/checkpoints.md; workbook chapter 7",
    starter='''"""Workbook 7.5: implement optimal_checkpoint_interval().

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
    id="8.6", title="implement dynamic_loss_scale()", kind="implement",
    filename="ex_8_6_dynamic_loss_scale.py",
    docs="docs/precision.md (loss scaling); workbook chapter 8",
    starter='''"""Workbook 8.6: implement dynamic_loss_scale().

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
                 hint="the protocol in the starter's docstring; docs/precision.md, 'Mixed precision'"),
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

EXERCISES = [BUBBLE_BUG, CHECKPOINT_INTERVAL, LOSS_SCALE]
