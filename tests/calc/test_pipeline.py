"""minidist.calc.pipeline against the worked numbers of the source documents.

"workbook X.Y" is the workbook's exercise X.Y (004_*.txt), "solutions" the
chapter 18 worked solutions (003_*.txt), "quiz QN" the chapter 26 quiz (002_*.txt).
"""
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import (bubble_fraction, idle_fraction, layers_per_stage,
                           min_microbatches, p2p_volume, peak_inflight_microbatches,
                           pipeline_activation_memory, warmup_forwards)
from minidist.calc.units import GB, MS

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_workbook_ex_5_1_1f1b_bubble_4_stages_12_microbatches():
    assert bubble_fraction(4, 12, "1f1b") == pytest.approx(0.25)
    # "the steady-state ... covers only 9/12 = 75% of the time"
    assert 1 - bubble_fraction(4, 12, "1f1b") == pytest.approx(0.75)


def test_workbook_ch5_more_microbatches_and_interleaving_shrink_the_bubble():
    # "With m=32, bubble = 3/32 = 9.4%. With interleaved stages (v=4), 3/128 = 2.3%."
    assert bubble_fraction(4, 32, "1f1b") == pytest.approx(0.094, abs=5e-4)
    assert bubble_fraction(4, 32, "interleaved", 4) == pytest.approx(0.023, abs=5e-4)


def test_workbook_ex_5_2_1f1b_activation_memory():
    per_microbatch = 2 * GB
    # GPipe stashes every micro-batch: 12 x 2 = 24 GB (reproduced)
    assert pipeline_activation_memory(per_microbatch, 4, 12, "gpipe") / GB == pytest.approx(24)
    # The workbook counts the p-1 = 3 warmup forwards: 3 x 2 = 6 GB.
    assert warmup_forwards(4) == 3
    assert warmup_forwards(4) * per_microbatch / GB == pytest.approx(6)
    # The first stage's peak is one more: after its 3 warmup forwards it runs the
    # steady-state forward of micro-batch 4 before the backward of micro-batch 1,
    # so it holds p = 4 micro-batches: 4 x 2 = 8 GB, and GPipe needs 3x as much,
    # not the workbook's 4x.
    assert peak_inflight_microbatches(4, 12, "1f1b") == 4
    assert pipeline_activation_memory(per_microbatch, 4, 12, "1f1b") / GB == pytest.approx(8)
    assert peak_inflight_microbatches(4, 12, "gpipe") / peak_inflight_microbatches(4, 12) == 3


def test_1f1b_later_stages_hold_fewer_and_never_more_than_m():
    assert [peak_inflight_microbatches(4, 12, stage=s) for s in range(4)] == [4, 3, 2, 1]
    assert peak_inflight_microbatches(8, 3, "1f1b") == 3


def test_workbook_ex_5_3_interleaved_bubble():
    assert bubble_fraction(4, 12, "interleaved", virtual_stages=4) == pytest.approx(0.0625)
    # "4x reduction in bubble — from 25% to 6.25%"
    assert bubble_fraction(4, 12) / bubble_fraction(4, 12, "interleaved", 4) == pytest.approx(4)


def test_workbook_ex_5_4_point_to_point_volume():
    assert 4 * 4 - 1 == 15                                   # virtual-stage boundaries
    volume = p2p_volume(0.5 * GB, stages=4, microbatches=12, virtual_stages=4)
    assert volume / GB == pytest.approx(180)
    # "At 600 GB/s NVLink, the raw transfer time is 300 ms"
    assert volume / (600 * GB) / MS == pytest.approx(300)


def test_workbook_ex_5_5_interleaved_bubble_has_no_p_minus_1_in_the_denominator():
    buggy = (4 - 1) / ((4 - 1) + 12 * 4)                     # the highlighted line 5
    assert bubble_fraction(4, 12, "interleaved", 4) == pytest.approx(3 / 48)
    assert bubble_fraction(4, 12, "interleaved", 4) != pytest.approx(buggy)


def test_workbook_ex_5_6_microbatches_for_a_bubble_under_5_percent():
    # "m=140 gives exactly 5%, so you need m >= 141 for strictly less than 5%"
    assert bubble_fraction(8, 140) == pytest.approx(0.05)
    assert min_microbatches(8, 0.05) == 141


def test_workbook_ex_5_6_interleaved_counts_are_one_short():
    # The workbook adds "v=2 gives bubble < 5% at m=70, v=4 at m=35". Both are
    # exactly 5%: 7 / (70 x 2) = 7 / (35 x 4) = 7/140 = 0.05. Strictly below 5%
    # needs one more micro-batch, by the same rule it applies for v = 1.
    assert bubble_fraction(8, 70, "interleaved", 2) == pytest.approx(0.05)
    assert bubble_fraction(8, 35, "interleaved", 4) == pytest.approx(0.05)
    assert min_microbatches(8, 0.05, "interleaved", 2) == 71
    assert min_microbatches(8, 0.05, "interleaved", 4) == 36


def test_workbook_ex_9_6_405b_bubble_exceeds_100_percent():
    assert bubble_fraction(16, 4, "1f1b") == pytest.approx(3.75)
    assert bubble_fraction(16, 4, "interleaved", 2) == pytest.approx(1.875)
    # as a share of the step's time: 15 / (4 + 15) of it idle
    assert idle_fraction(16, 4, "1f1b") == pytest.approx(15 / 19)


def test_workbook_ex_9_2_126_layers_on_16_stages():
    assert 126 / 16 == pytest.approx(7.875)
    split = layers_per_stage(126, 16)
    assert Counter(split) == {8: 14, 7: 2}
    assert sum(split) == 126


def test_quiz_q5_gpipe_4_stages_16_microbatches_idle_16_percent_of_the_step():
    assert idle_fraction(4, 16, "gpipe") == pytest.approx(0.16, abs=0.005)
    assert bubble_fraction(4, 16, "gpipe") == pytest.approx(3 / 16)   # idle / ideal


def test_solutions_gpipe_8_stages_idle_47_percent_of_the_step():
    assert idle_fraction(8, 8, "gpipe") == pytest.approx(0.47, abs=0.005)
    assert idle_fraction(8, 64, "gpipe") == pytest.approx(0.10, abs=0.005)


@given(p=st.integers(1, 64), m=st.integers(1, 512))
def test_1f1b_and_gpipe_leave_the_same_idle_time_in_either_convention(p, m):
    assert bubble_fraction(p, m, "gpipe") == bubble_fraction(p, m, "1f1b") == (p - 1) / m
    assert idle_fraction(p, m, "gpipe") == idle_fraction(p, m, "1f1b")


@given(p=st.integers(1, 64), m=st.integers(1, 512), v=st.integers(1, 8),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]))
def test_idle_over_total_is_x_over_1_plus_x_of_idle_over_ideal(p, m, v, schedule):
    x = bubble_fraction(p, m, schedule, v)
    assert idle_fraction(p, m, schedule, v) == pytest.approx(x / (1 + x), rel=1e-12)
    assert idle_fraction(p, m, schedule, v) < 1


@given(p=st.integers(2, 32), v=st.integers(1, 8),
       target=st.sampled_from([0.01, 0.05, 0.1, 0.25]))
def test_min_microbatches_is_the_first_to_get_below_target(p, v, target):
    m = min_microbatches(p, target, "interleaved", v)
    assert bubble_fraction(p, m, "interleaved", v) < target
    if m > 1:
        assert bubble_fraction(p, m - 1, "interleaved", v) >= target * (1 - 1e-12)


def test_unknown_schedule_is_an_error():
    with pytest.raises(ValueError, match="schedule"):
        bubble_fraction(4, 8, "zero-bubble")
