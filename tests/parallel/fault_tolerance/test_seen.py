"""The trace shows fault tolerance: the failed step as an instant, the quorum change as a
span, and the healing transfer as a span on its source and on the replica it heals,
named with the bytes moved, which are those the source counted."""
import pytest

from minidist import trace
from minidist.comm import World
from minidist.comm.launch import RankLost
from minidist.trace.check import check

from parallel.fault_tolerance.ft_cases import case_of, train_on_rank

# 3 replicas, 2 in the quorum: replica 1 dies in backward at step 2, spare 2 heals from 0
CASE = case_of(replicas=3, num_replicas=2, steps=4, kills=[(1, 0, 2, "backward")])


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ft_trace") / "run.json")
    with trace.record(path):
        with World(3, fault_tolerant=True, timeout=20.0, run_timeout=90.0) as world:
            got = world.run(train_on_rank, CASE)
    return trace.load(path), got


def _events(t, pid, name_start):
    return [e for e in t["traceEvents"] if e.get("cat") == "fault_tolerance"
            and e["pid"] == pid and e["name"].startswith(name_start)]


def test_the_trace_is_valid_with_the_fault_tolerance_events(traced):
    # flows left open are expected: messages to and from the killed rank, and those a
    # survivor sent in the failed quorum's context, set aside and never received
    t, got = traced
    assert got[1] == RankLost(1, -9)
    assert check(t, flows_matched=False) == []


def test_the_failed_step_is_an_instant_before_the_smaller_quorum(traced):
    t, _ = traced
    (failed,) = _events(t, 0, "step 2 failed")
    assert failed["ph"] == "i" and failed["args"]["step"] == 2
    assert failed["args"]["error"].startswith("PeerDiedError")
    first, second = _events(t, 0, "quorum ")
    assert first["name"] == second["name"] == "quorum 2 of 3"
    assert first["args"]["members"] == [0, 1] and first["args"]["step"] == 0
    assert second["args"] == {"step": 2, "members": [0, 2], "left": [1], "healed": [2],
                              "source": 0}
    assert first["ts"] < failed["ts"] <= second["ts"]


def test_the_healing_transfer_is_a_span_inside_the_quorum_change_on_both_ends(traced):
    t, got = traced
    sent = got[0]["changes"][-1].bytes
    assert sent > 0
    name = f"heal from replica 0 ({sent} bytes)"
    for pid, was_sent in ((0, True), (2, False)):
        heals = [e for e in _events(t, pid, "heal from") if e["args"]["healed"] == [2]]
        (span,) = heals
        assert span["name"] == name and span["ph"] == "X"
        assert span["args"] == {"source": 0, "healed": [2], "bytes": sent, "sent": was_sent}
        (quorum,) = [e for e in _events(t, pid, "quorum ") if e["args"]["healed"] == [2]]
        assert quorum["ts"] <= span["ts"]
        assert span["ts"] + span["dur"] <= quorum["ts"] + quorum["dur"]
