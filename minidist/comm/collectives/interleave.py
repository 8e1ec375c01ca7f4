"""Two computations of one rank taking turns: each hands the other its turn while its own
collective is in flight (DeepSeek-V3's overlap inside DualPipe's F&B op).

    turns = Turns(("F3", "B1 c1"))
    turns.run(forward_half, backward_half)    # the first half starts; returns when both end

    # inside either half, around a collective started in the background:
    work = dist.all_to_all_single(out, x, ..., async_op=True)
    hand_over(work)      # the other half runs until its own collective is in flight (or
                         # it ends); then this half goes on, once ``work`` has landed

One half runs at a time (a baton passes between two threads), so everything the two
do, every collective each issues on every group included, happens in an order fixed by
where the hand-overs fall: the same on every rank running the same two halves, as the
ranks of a group must issue their collectives in one order (work.py). Each half does
its own arithmetic in its own order, so the results are those of running the first
half, then the second, bit for bit; what changes is only *when* a half waits. For an
MoE layer's forward (F) beside another micro-batch's backward (B)::

    F  | attention  route |~~dispatch~~|           | experts |~~combine~~|
    B  |                  | combine'   |~~a2a'~~~~ |         | experts'  | ...
                          ^ F hands over            ^ B hands over

Outside ``Turns.run`` (``paired()`` is False) ``hand_over`` only waits: a plain call.
While tracing, each stretch a half runs is a span of cat "turn" (named by the label
given) on a row of its own per half, "F&B turns: first half" and "... second half": on
the halves' threads they would cross the module spans a stretch starts or ends inside
(the first half runs on the calling thread, the second on the thread "second half", one
per process, kept for the next pair). A blocking call on that thread is exposed
communication in ``minidist trace summary`` (trace/summary.py's TURN_THREAD): while it
blocks, the first half is parked and the rank computes nothing.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from minidist import backend
from minidist.trace import recorder as trace
from minidist.trace.summary import TURN_THREAD

TURN = "turn"            # the trace category of a half's stretch of running
TURN_ROWS = ("F&B turns: first half", "F&B turns: second half")   # their trace rows


class Turns:
    """A baton between two halves (module docstring): ``run`` them, the first one first."""

    def __init__(self, labels: tuple[str, str], args: tuple[dict, dict] | None = None):
        self.labels = labels                      # each half's name in the trace
        self.args = args or ({}, {})              # and the args of its spans
        self._cond = threading.Condition()
        self._turn = 0                            # the half that may run now
        self._done = [False, False]
        self._errors: list[BaseException | None] = [None, None]
        self._since = [0.0, 0.0]                  # when each half's current stretch began

    def run(self, first: Callable[[], None], second: Callable[[], None]) -> None:
        """Run ``first`` here and ``second`` on the helper thread, taking turns; re-raise
        the first error either raised (after both ended)."""
        _helper.submit(lambda: self._half(1, second))
        self._half(0, first)
        with self._cond:
            while not self._done[1]:
                self._cond.wait()
        for error in self._errors:
            if error is not None:
                raise error

    def _half(self, me: int, fn: Callable[[], None]) -> None:
        _local.turns, _local.me = self, me
        try:
            self._wait_for_turn(me)
            self._begin(me)
            fn()
        except BaseException as e:     # re-raised by run(), once the other half ended too
            self._errors[me] = e
        finally:
            self._end(me)
            _local.turns = None
            with self._cond:
                self._done[me] = True
                self._turn = 1 - me
                self._cond.notify_all()

    def wait_on(self, me: int, work: Any) -> None:
        """Let the other half run (unless it has ended) until it hands the turn back;
        then wait for ``work`` and go on."""
        self._end(me)
        with self._cond:
            if not self._done[1 - me]:
                self._turn = 1 - me
                self._cond.notify_all()
        self._wait_for_turn(me)
        work.wait()
        self._begin(me)

    def _wait_for_turn(self, me: int) -> None:
        with self._cond:
            while self._turn != me:
                self._cond.wait()

    def _begin(self, me: int) -> None:
        if trace.active is not None:
            self._since[me] = trace.active.now()

    def _end(self, me: int) -> None:
        if trace.active is not None:
            trace.active.span(self.labels[me], TURN, self._since[me], trace.active.now(),
                              dict(self.args[me], half=me), tid=trace.active.tid(TURN_ROWS[me]))


def paired() -> bool:
    """Whether this thread runs one half of a ``Turns`` (so a collective it starts in
    the background can let the other half run)."""
    return getattr(_local, "turns", None) is not None


def hand_over(work: Any) -> None:
    """Wait for ``work`` (an async collective's ``Work``), letting the other half of this
    thread's ``Turns`` run meanwhile; outside a pair, only wait."""
    turns = getattr(_local, "turns", None)
    if turns is None:
        work.wait()
    else:
        turns.wait_on(_local.me, work)


class _Helper:
    """The thread that runs second halves, one after another (one per process, so a
    trace shows it as one row); started at the first pair."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.jobs: "queue.Queue" = queue.Queue()

    def submit(self, job: Callable[[], None]) -> None:
        device = backend.current_device()          # the caller's GPU (CuPy: per thread)
        self.jobs.put((job, device))
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._loop, name=TURN_THREAD, daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while True:
            job, device = self.jobs.get()
            if device is not None:
                backend.use_device(device)
            job()


_local = threading.local()     # this thread's Turns and which half it runs, while paired
_helper = _Helper()
