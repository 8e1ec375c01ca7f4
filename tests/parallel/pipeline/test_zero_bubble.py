"""Zero-bubble schedules (ZB-H1, ZB-H2, ZB-V) as data: order, dependencies, bubble, memory.

No processes here: test_pipeline.py runs the same schedules in real processes
(gradients and AdamW step equal to one process's; bubbles on a logical clock).
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc.pipeline import bubble_fraction
from minidist.parallel.pipeline.executor import measured_bubble
from minidist.parallel.pipeline.schedule import (Op, check_local_order, make_schedule,
                                                 placement, simulate)

ZB = ("zb_h1", "zb_h2", "zb_v")


def _run(name, p, m):
    v = 2 if name == "zb_v" else 1
    schedule = make_schedule(name, p, m)
    # T_F = T_B = T_W = 1: a whole backward costs 2
    return schedule, simulate(schedule, v, 1.0, 2.0, placement=placement(name))


def _held(ops):
    """Most micro-batch chunks a stage holds at once, each from its F to its W."""
    held = peak = 0
    for op in ops:
        held += {"F": 1, "B": 0, "W": -1}[op.kind]
        peak = max(peak, held)
    return peak


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(ZB), p=st.integers(1, 6), m=st.integers(1, 20))
def test_each_microbatch_runs_f_then_b_then_w_once_on_every_stage(name, p, m):
    schedule, timings = _run(name, p, m)      # simulate raises on a broken dependency
    v = 2 if name == "zb_v" else 1
    for ops, row in zip(schedule, timings):
        assert sorted((o.kind, o.microbatch, o.chunk) for o in ops) == sorted(
            (k, i, c) for k in "FBW" for i in range(m) for c in range(v))
        pos = {o: k for k, o in enumerate(ops)}
        for o in ops:
            if o.kind != "F":
                before = Op("F" if o.kind == "B" else "B", o.microbatch, o.chunk)
                assert pos[before] < pos[o]
        assert all(a <= b for (_, _, a), (_, b, _) in zip(row, row[1:]))  # one op at a time


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 24))
def test_zb_h1_bubble_is_a_third_of_1f1b_with_1f1b_memory(p, m):
    schedule, timings = _run("zb_h1", p, m)
    if m >= p:
        assert measured_bubble(timings) == pytest.approx(bubble_fraction(p, m, "zb_h1"), abs=1e-12)
        assert measured_bubble(timings) == pytest.approx(bubble_fraction(p, m, "1f1b") / 3)
    assert max(_held(ops) for ops in schedule) == min(p, m)     # 1F1B's peak, stage 0's


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 24))
def test_zb_h2_has_no_bubble_for_twice_the_memory(p, m):
    schedule, timings = _run("zb_h2", p, m)
    if m >= 2 * p - 1:
        assert measured_bubble(timings) == 0.0 == bubble_fraction(p, m, "zb_h2")
    assert max(_held(ops) for ops in schedule) == min(2 * p - 1, m)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 24))
def test_zb_v_bubble_is_at_most_zb_h1s_and_near_zero_from_m_2p(p, m):
    _, timings = _run("zb_v", p, m)
    _, h1 = _run("zb_h1", p, m)
    bubble = measured_bubble(timings)
    assert bubble <= measured_bubble(h1) + 1e-12
    if m >= 2 * p:      # the paper's 0; this list scheduler leaves a few time units at p >= 5
        assert bubble <= (p - 1) / (6 * m)
        if p <= 4:
            assert bubble == 0.0 == bubble_fraction(p, m, "zb_v")


def test_the_issue_table_p4_m8():
    bubbles = {name: measured_bubble(_run(name, 4, 8)[1]) for name in ZB}
    assert abs(bubbles["zb_h1"] - 3 / 24) < 1e-12
    assert bubbles["zb_h2"] < 0.05 and bubbles["zb_v"] < 0.05


def test_zb_v_holds_the_first_and_last_piece_on_rank_0():
    schedule = make_schedule("zb_v", 3, 4)
    # the loss is on rank 0's second chunk: its B of micro-batch 0 needs no message
    timings = simulate(schedule, 2, placement="v")
    first_b = next(op for op, _, _ in timings[0] if op.kind == "B")
    assert first_b == Op("B", 0, 1)


def test_simulator_names_the_dependency_a_hand_edited_schedule_breaks():
    schedule = make_schedule("zb_h1", 3, 4)
    swapped = [list(ops) for ops in schedule]
    k = swapped[1].index(Op("W", 0))
    j = swapped[1].index(Op("B", 0))
    swapped[1][j], swapped[1][k] = swapped[1][k], swapped[1][j]
    with pytest.raises(ValueError, match=r"stage 1: W0 comes before B0, which it needs"):
        simulate(swapped, 1)
    missing = [list(ops) for ops in schedule]
    missing[2].remove(Op("W", 3))
    with pytest.raises(ValueError, match=r"stage 2 runs F3 but never W3"):
        check_local_order(missing)
    # stage 0 waits for B0 of stage 1 before its own F1, which stage 1 needs first
    stuck = [[Op("F", 0), Op("F", 1), Op("B", 0), Op("B", 1)],
             [Op("F", 0), Op("B", 0), Op("F", 1), Op("B", 1)]]
    assert simulate(stuck, 1)                  # fine: 1F1B for p = m = 2
    stuck = stuck[::-1]
    with pytest.raises(RuntimeError, match=r"stage 0's B0 waits for B0 of stage 1; "
                                           r"stage 1's F1 waits for F1 of stage 0"):
        simulate(stuck, 1)


def test_calc_refuses_m_below_where_the_formula_holds():
    with pytest.raises(ValueError, match="zb_h2 bubble formula needs m >= 7"):
        bubble_fraction(4, 6, "zb_h2")
