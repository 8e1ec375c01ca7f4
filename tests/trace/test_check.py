"""The format check fails where a viewer would: each broken rule is reported."""
from minidist.trace.check import check


def span(name, ts, dur, pid=0, tid=0):
    return {"ph": "X", "name": name, "cat": "comm", "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def test_a_valid_trace_has_no_problems():
    events = [span("outer", 0, 10), span("inner", 2, 3), span("next", 10, 1),
              {"ph": "s", "name": "message", "cat": "flow", "id": 7, "ts": 3, "pid": 0, "tid": 0},
              {"ph": "f", "name": "message", "cat": "flow", "id": 7, "ts": 4, "pid": 1, "tid": 0,
               "bp": "e"},
              {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}}]
    assert check({"traceEvents": events}) == []


def test_each_broken_rule_is_reported():
    assert check({}) == ["no traceEvents list"]
    assert "no 'dur'" in check({"traceEvents": [{"ph": "X", "name": "a", "cat": "c", "ts": 0,
                                                 "pid": 0, "tid": 0}]})[0]
    assert "not an integer" in check({"traceEvents": [span("a", 0, 1, pid="0")]})[0]
    assert "without nesting" in check({"traceEvents": [span("a", 0, 10), span("b", 5, 10)]})[0]
    assert check({"traceEvents": [span("a", 0, 10), span("b", 5, 10, tid=1)]}) == []
    lone = {"ph": "s", "name": "m", "cat": "flow", "id": 1, "ts": 0, "pid": 0, "tid": 0}
    assert "1 start(s), 0 end(s)" in check({"traceEvents": [lone]})[0]
    assert check({"traceEvents": [lone]}, flows_matched=False) == []
    same = dict(lone, ph="f", bp="e")
    assert any("ends on the rank that sent it" in p for p in check({"traceEvents": [lone, same]}))
