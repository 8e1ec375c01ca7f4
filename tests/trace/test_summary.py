"""The summary's interval arithmetic against a brute-force count, and its numbers
on a hand-made trace."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.trace.summary import length, minus, render, summarize, union

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
