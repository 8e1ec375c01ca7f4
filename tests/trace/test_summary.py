"""The summary's interval arithmetic against a brute-force count, and its numbers
on a hand-made trace."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.trace.summary import length, minus, render, summarize, union, within

intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)).map(
    lambda p: (p[0], p[0] + p[1])), max_size=8)


def covered(ivs):
    return {x for a, b in ivs for x in range(a, b)}


@settings(max_examples=200, deadline=None)
@given(intervals, intervals)
def test_union_and_difference_cover_the_right_points(a, b):
    ua, ub = union(a), union(b)
    assert length(ua) == len(covered(a))
    assert all(ua[k][1] < ua[k + 1][0] for k in range(len(ua) - 1))
    assert length(minus(ua, ub)) == len(covered(a) - covered(b))
    assert length(within(ua, ub)) == len(covered(a) & covered(b))


def test_summary_of_a_hand_made_trace():
    ev = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
        {"ph": "X", "name": "fwd", "cat": "module", "ts": 0, "dur": 10, "pid": 0, "tid": 0},
        {"ph": "X", "name": "all_reduce", "cat": "comm", "ts": 6, "dur": 8, "pid": 0, "tid": 1,
         "args": {"group": [0, 1], "bytes_sent": 4, "bytes_recv": 4}},
        {"ph": "X", "name": "idle gap end", "cat": "optim", "ts": 20, "dur": 2, "pid": 0, "tid": 0},
    ]
    s = summarize({"traceEvents": ev})
    row = s["ranks"][0]
    assert (row["window"], row["busy"], row["idle"], row["comm"], row["exposed_comm"]) == \
        (22, 16, 6, 8, 4)
    assert "rank 0" in render(s) and "all_reduce" in render(s)


def test_a_blocking_call_of_the_second_half_is_exposed_though_the_f_and_b_span_covers_it():
    """DualPipeV's F&B op is one span on the main thread; its second half runs on the
    thread TURN_THREAD while the main thread is parked, so that thread's wait hid
    nothing (25 exposed), whereas the comm thread's all-to-all, under the span, is hidden."""
    from minidist.trace.summary import TURN_THREAD

    def span(name, tid, ts, dur, cat="comm"):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0,
                "tid": tid, "args": {"group": [0, 1], "step": 0}}
    ev = [
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 3, "args": {"name": TURN_THREAD}},
        span("F3 & B1 c1", 0, 0, 100, cat="pipeline"),
        span("wait", 3, 40, 25),                          # the second half blocks
        span("all_to_all_single", 2, 10, 20),             # on the comm thread: hidden
    ]
    row = summarize({"traceEvents": ev})["ranks"][0]
    assert (row["comm"], row["exposed_comm"], row["busy"]) == (45, 25, 100)


def test_exposed_communication_is_cut_by_the_unit_wait_it_fell_in():
    """Two units' gather waits and one reduce-scatter wait on the main thread (cat "zero"),
    the comm thread's calls under them: each family gets the exposed time inside its
    spans (its units together), the rest is elsewhere; hidden time counts for none."""
    def span(name, tid, ts, dur, cat="comm"):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 0,
                "tid": tid, "args": {}}
    ev = [
        span("FSDP gather unit 0 (forward)", 0, 0, 10, cat="zero"),
        span("all_gather", 0, 2, 6),                               # blocking: 6 exposed
        span("FSDP gather unit 1 (forward)", 0, 10, 5, cat="zero"),
        span("wait", 0, 10, 4),                                    # 4 exposed
        span("Block forward", 0, 15, 20, cat="module"),
        span("all_gather", 2, 14, 10),                             # hidden by the block
        span("FSDP reduce-scatter unit 1", 0, 40, 3, cat="zero"),
        span("wait", 0, 40, 3),                                    # 3 exposed
        span("reduce_scatter", 2, 36, 7),                          # 4 before the wait: exposed
    ]
    row = summarize({"traceEvents": ev})["ranks"][0]
    assert row["exposed_by"] == {"FSDP gather": 6 + 4, "FSDP reduce-scatter": 3}
    assert row["exposed_in_waits"] == {"FSDP gather": [6, 4], "FSDP reduce-scatter": [3]}
    assert row["exposed_comm"] == 6 + 4 + 3 + 4
    assert "FSDP gather 0.01, FSDP reduce-scatter 0.00, elsewhere 0.00" in render(
        summarize({"traceEvents": ev}))
