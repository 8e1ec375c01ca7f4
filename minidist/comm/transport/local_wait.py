"""How the local transport waits: its progress loop, the doorbell sleep, and the three
ways a wait ends early.

``LocalTransport`` (local.py) mixes this in, as it does the short ways. A wait runs
the progress loop (``_progress``: push queued sends, pull arriving pieces) until
its handles are done; between empty passes it follows wait.py's policy (spin,
yield, then sleep on its doorbell until a peer rings). It ends early in three ways,
each an error that names why:

- the world was aborted (a rank or the launcher failed): ``WorldAbortedError``;
- a peer it waits on has already returned from the run (shm.py's rank records
  count each rank's finished runs): ``PeerFinishedError``, at once;
- nothing moved for ``timeout`` seconds: ``CommTimeoutError``, with the hang
  report of every rank's last call (flight.py);
- in a world that goes on when a rank dies (``World(fault_tolerant=True)``), a rank
  of the collective it is in (``record_begin``'s ranks), or the peer it waits on,
  has died: ``PeerDiedError``, at once. Not only the peer waited on: in a ring, the
  neighbour of the dead rank stops sending too, and its own neighbour would wait
  out the timeout on a live rank. A group formed without the dead rank waits on.

"At once": the launcher counts the deaths it marks in one word of the segment
(``shm.W_DEATHS``), and every empty pass of a wait compares it with the count its
thread last checked its call against (``_death_unseen``, one read): a new death is
checked at the next pass, not after ``spin_s`` of spinning nor the 32 polls between
a long wait's looks at the clock. A call that begins in a world with deaths checks
its ranks at its first empty pass (``record_begin`` forgets the count), so a call
over a rank that died earlier fails at once too. The rest, from the SIGKILL to the
mark, is the operating system's: the launcher marks a death when the dead process's
sentinel is ready, after the kernel has torn the process down (its memory unmapped:
about 3 ms for an interpreter with NumPy and minidist on a 2-core VM, more under load;
T_detect in docs/fault_tolerance.md).

It uses the transport's ``_lock``, ``_progress``, ``_sends``, ``_ranks``, ``_bells``,
``_words``, ``_in``, ``_seg``, ``_link``, ``_in_call`` (an ``InCall``), ``_watched``,
``spin_s``, ``free_polls`` and ``timeout``.
"""
from __future__ import annotations

import threading
from typing import Any

from minidist.comm.errors import (TIMEOUT_HINT, CommTimeoutError, PeerDiedError,
                                   PeerFinishedError, WorldAbortedError)
from minidist.comm.transport import flight, shm
from minidist.comm.transport.wait import Backoff, in_background_thread
from minidist.trace import recorder as trace


class CallState:
    """The call a thread of this rank is in, as its waits need it: whose death
    ends it and what it is (``record_begin``), and the count of deaths its last
    check saw. Plain slots, written on every call of the latency path."""
    __slots__ = ("ctx", "number", "ranks", "deaths")

    def __init__(self) -> None:
        self.ctx: int | None = None   # the group's context
        self.number = -1              # the collective's number (-1: a send / recv, or none)
        self.ranks: list | None = None   # the group's ranks; None: no call (or given up)
        self.deaths = 0               # shm.W_DEATHS as this thread last checked it


class InCall(threading.local):
    """Each thread's ``CallState`` (the background thread of collectives/work.py
    runs calls beside the main thread's), made at the thread's first look: a
    call reads one attribute of the thread-local (``state``) and then writes
    plain slots, not one thread-local attribute per field."""

    def __init__(self) -> None:
        self.state = CallState()


class LocalWaits:
    """The waiting half of ``LocalTransport``."""

    def flush(self) -> None:
        """Wait until every queued send is written into its channel. A send waits in its
        queue while the channel to its peer is full, and moves only when this rank next
        talks to the transport: a rank that returns from a run with one still queued
        would leave its peer waiting on a rank that counts itself finished."""
        with self._lock:
            for dead in self.failed_ranks():   # nothing will take what waits for the dead
                self._sends.pop(dead, None)
            queued = [send for queue in self._sends.values() for send in queue]
        if queued:
            self.wait_all(queued, what="the sends still queued when the run returned")

    def wait_all(self, handles: list, timeout: float | None = None, what: str = "",
                 abortable: bool = True) -> None:
        timeout = self.timeout if timeout is None else timeout
        backoff = Backoff(0.0 if in_background_thread() else self.spin_s, self.free_polls)
        while True:
            with self._lock:
                moved = self._progress()
            if all(h.done for h in handles):
                return
            if moved:
                backoff.reset()
                continue
            if self._link is not None and self._link.sleep_until_next():
                if abortable:   # slept while a piece was on the (emulated) wire
                    self._check_abort()
                continue
            if not backoff.idle():
                if abortable and self._death_unseen():   # a death: check it now
                    self._check_abort()
                    self._check_peers(handles)
                continue
            if abortable:
                self._check_abort()
                self._check_peers(handles)
            if backoff.idle_seconds() > timeout:
                raise self._timeout_error(handles, timeout, what)
            self._sleep(handles)

    def _sleep(self, handles: list) -> None:
        """Sleep on our doorbell until a peer rings (at most 50 ms), or, on an emulated
        link, until the first piece on the wire lands: its peer rang when it published
        it (maybe just before the mark was read), and will not ring again when it lands."""
        def news() -> bool:   # look once more, now that peers know we may sleep
            with self._lock:
                moved = self._progress()
            return moved or all(h.done for h in handles)

        def nap() -> float:   # asked after the mark is read: a piece its ring announced
            return 0.05 if self._link is None else self._link.seconds_to_next(0.05)
        self.wait_news(self.news_mark(), nap, news)

    def news_mark(self) -> int:
        """This rank's doorbell: the launcher rings it for every death it marks and every
        rank's return from a run (shm.mark_died, shm.finish_run), peers for each piece."""
        return self._bells.value(self.rank)

    def wait_news(self, mark: int, timeout, news=None) -> None:
        """Sleep on our doorbell until it rings after ``mark`` was read (at once if it
        did), or ``timeout`` seconds: a wait with nothing to do (``_sleep``), a spare
        waiting for a member to die or finish. ``news()``, asked once the peers know we
        may sleep: True if there is no need to. ``timeout`` may be a function, asked
        after ``news()``: a ring counted in ``mark`` may announce a piece still on the
        emulated wire, which rings no more when it lands, so the nap must end by then."""
        bells, me = self._bells, self.rank
        with self._lock:
            bells.sleepers(me, +1)
        try:
            if news is None or not news():
                seconds = timeout() if callable(timeout) else timeout
                if seconds > 0:
                    bells.wait(me, mark, seconds)
        finally:
            with self._lock:
                bells.sleepers(me, -1)

    def wait_handle(self, handle: Any, timeout: float | None = None) -> None:
        """``handle.wait()`` of an isend / irecv: wait for it, noted in the flight
        recorder like a blocking send / recv (a rank stuck here is named by it)."""
        self._flight.begin(0, -1, self._all_ranks, handle.describe())
        self.wait_all([handle], timeout)
        self._flight.end()

    def _death_unseen(self) -> bool:
        """Has the launcher marked a death since this thread's last check (``_check_abort``)
        in this call? One read of a word: cheap enough for every empty pass of a wait."""
        return self._words[shm.W_DEATHS] != self._in_call.state.deaths

    def _check_abort(self) -> None:
        # the count first: mark_died writes the rank's word before it counts the death
        state = self._in_call.state
        state.deaths = self._words[shm.W_DEATHS]
        if self._words[shm.W_ABORT]:
            failed, msg = shm.abort_reason(self._seg)
            who = "the launcher" if failed < 0 else f"rank {failed}"
            raise WorldAbortedError(f"rank {self.rank}: stopping because {who} failed: {msg}")
        if state.ranks is not None:   # a collective: its ranks, or those its context watches
            watched = self._watched.get(state.ctx, state.ranks) if state.number >= 0 else []
            self._check_died(watched, "the collective it is in")

    def failed_ranks(self) -> list[int]:
        """The ranks seen dead by a launcher that lets the world go on without them."""
        stride = shm.RANK_WORDS
        return [r for r in range(self.world_size) if self._ranks[r * stride + shm.R_DIED]]

    def has_returned(self, rank: int) -> bool:
        """Has ``rank`` finished more runs than this rank (returned from this one)?"""
        runs, stride = self._ranks, shm.RANK_WORDS
        return runs[rank * stride + shm.R_RUNS] > runs[self.rank * stride + shm.R_RUNS]

    def _check_died(self, ranks: list[int], what: str) -> None:
        stride = shm.RANK_WORDS
        for r in ranks:
            died = self._ranks[r * stride + shm.R_DIED]
            if died and not self._had_finished(r):
                self._in_call.state.ranks = None   # the call is given up: watch nothing after it
                raise PeerDiedError(f"rank {self.rank}: rank {r} of {what} has died (exit "
                                    f"code {died - shm.DIED_BASE}): nothing more will come from it", r)

    def _had_finished(self, r: int) -> bool:
        """Had dead rank r finished the collective this rank is in? Then it sent all it
        was to send (a call ends when its sends are in the channels), and its death
        must not fail a survivor that is slower through the same call: also where it
        died in a call of another group after it (its last finished collective,
        flight.py), as a victim that voted and died in the next step's all-reduce."""
        state = self._in_call.state
        if state.number < 0:
            return False
        return self._flight_records()[r].finished(state.ctx, state.number)

    def _check_peers(self, handles: list) -> None:
        """A long wait on a peer that has finished the run this rank is in (it counts
        more finished runs) will never end: say so now, naming it."""
        self._check_died([h.peer() for h in handles if not h.done and h.peer() is not None],
                         "the send or receive it waits on")
        for h in handles:
            peer = h.peer()
            if h.done or peer is None or not self.has_returned(peer):
                continue
            if self._words[self._in[peer].head_i] != self._in[peer].count:
                continue  # it sent pieces we have not taken yet: still on an emulated wire
            # The peer wrote what it sent before it counted the run: one more pass
            # takes what came since our last one (sent, then finished: no error)
            with self._lock:
                self._progress()
            if not h.done:
                raise PeerFinishedError(
                    f"rank {self.rank}: {h.describe()} cannot complete: rank {peer} has "
                    f"returned from the function this world runs (it finished early, or "
                    f"skipped a call the others make)")

    def _timeout_error(self, handles, timeout, what) -> CommTimeoutError:
        self._in_call.state.ranks = None   # the call is given up (PeerDiedError's case too)
        pending = [h.describe() for h in handles if not h.done]
        where = f" in {what}" if what else ""
        report = flight.hang_report(self._flight_records(), self.rank)
        if trace.active is not None:   # the hang report as an instant event (trace/)
            trace.active.instant("hang report", "failure", dict(report=report), scope="p")
        return CommTimeoutError(
            f"rank {self.rank}: waited {timeout:g} s{where} without progress on: "
            + "; ".join(pending) + "\n" + report + "\n" + TIMEOUT_HINT)
