"""What the trace shows of fault tolerance: the failed step, the quorum change, the healing.

Three kinds of event, in the category ``fault_tolerance``, on every rank that lived
through them (recorded only while a trace records, trace/recorder.py):

    i  "step 7 failed"                   an instant when the vote does not commit: the
                                         step's gradients are dropped ({"step", "error"})
    X  "quorum 3 of 4"                   a span over the forming of a new quorum (the
                                         groups, the exchange of steps, the healing):
                                         {"step", "members", "left", "healed", "source"}
    X  "heal from replica 0 (N bytes)"   a span over the transfer itself, on the source
                                         and on each replica it heals; N = 16 + len(buffer)
                                         per healed replica (heal.py, pack.py),
                                         {"source", "healed", "bytes", "sent"}

The quorum's span holds the healing's; the failed step's instant comes just before it
(the vote that failed, then the next ``start_quorum``). ``minidist trace summary`` and
Perfetto show them beside the collectives' spans of the same ranks.
"""
from __future__ import annotations

from minidist.parallel.fault_tolerance.change import QuorumChange
from minidist.trace import recorder as trace

CATEGORY = "fault_tolerance"


def now() -> float:
    """The trace's clock (perf_counter seconds), 0.0 when nothing records."""
    return trace.active.now() if trace.active is not None else 0.0


def step_failed(step: int, error: Exception | None) -> None:
    """The vote of ``step`` did not commit (a member failed it, or the vote itself failed)."""
    if trace.active is None:
        return
    why = "another member failed it" if error is None else f"{type(error).__name__}: {error}"
    trace.active.instant(f"step {step} failed", CATEGORY, {"step": step, "error": why},
                         scope="p")


def quorum_changed(change: QuorumChange, start: float) -> None:
    """The span of forming ``change``'s quorum, from ``start`` until now."""
    if trace.active is None:
        return
    args = {"step": change.step, "members": list(change.members),
            "left": [replica for replica, _ in change.left], "healed": list(change.healed),
            "source": change.source}
    trace.active.span(f"quorum {len(change.members)} of {change.total}", CATEGORY, start,
                      trace.active.now(), args)


def healing(source: int, healed: tuple, nbytes: int, sent: bool, start: float) -> None:
    """The span of one rank's part of the healing transfer: ``nbytes`` per healed replica,
    sent (the source) or received."""
    if trace.active is None:
        return
    args = {"source": source, "healed": list(healed), "bytes": nbytes, "sent": sent}
    trace.active.span(f"heal from replica {source} ({nbytes} bytes)", CATEGORY, start,
                      trace.active.now(), args)
