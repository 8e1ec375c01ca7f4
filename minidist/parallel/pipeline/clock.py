"""When each op of a pipeline rank ran: the timeline the bubble is measured from.

``run_pipeline`` (executor.py) brackets every op with ``begin`` and ``end``;
the clock records (op, start, end) in one of three ways:

    measured    time.perf_counter at the op's start and end (one clock for all
                processes of a machine)
    op_seconds  the same, each op made to last at least its cost (op.py's
                op_cost), sleeping out the rest: equal-cost stages on any machine,
                so that measured bubbles compare with the formulas
    op_costs    a logical clock: an op starts when its rank is free and its input
                has arrived, and lasts exactly its cost. The arrival is the
                sender's end time, which travels beside the message (``stamp``
                on send, ``arrived`` on receive), so the bubble of a real run
                comes out the same on an idle or a loaded machine.
"""
from __future__ import annotations

import time

from minidist.parallel.pipeline.op import Op, op_cost


class OpClock:
    """The timeline of one rank's ops in one step (the module docstring)."""

    def __init__(self, op_seconds: tuple | None, op_costs: tuple | None, split: bool,
                 virtual: int):
        self.op_seconds, self.op_costs = op_seconds, op_costs
        self.split, self.virtual = split, virtual
        self.timeline: list[tuple[Op, float, float]] = []
        self.logical = op_costs is not None   # send and receive time stamps
        self._span = (0.0, 0.0)   # the logical clock: the current (or last) op's start, end
        self._arrived = 0.0       # the logical time the current op's inputs had all arrived
        self._start = 0.0

    def arrived(self, sent_at: float) -> None:
        """An input of the current op was sent at logical time ``sent_at``."""
        self._arrived = max(self._arrived, sent_at)

    def stamp(self) -> float:
        """The logical time a message sent now carries: the end of the op that
        produced it (the current op, or the last one)."""
        return self._span[1]

    def begin(self, op: Op) -> None:
        """The op starts (its inputs are here)."""
        self._start = time.perf_counter()
        if self.logical:
            start = max(self._span[1], self._arrived)
            self._span = start, start + op_cost(op.kind, self.op_costs, self.split, self.virtual)
            self._arrived = 0.0

    def end(self, op: Op) -> None:
        """The op is done: record its (op, start, end)."""
        start = self._start
        if self.op_seconds is not None:
            _sleep_until(start + op_cost(op.kind, self.op_seconds, self.split, self.virtual))
        end = time.perf_counter()
        if self.logical:
            start, end = self._span
        self.timeline.append((op, start, end))


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0.002:
        time.sleep(remaining - 0.001)      # sleep most of it, spin the last millisecond
    while time.perf_counter() < deadline:
        pass
