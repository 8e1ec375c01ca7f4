"""Waiting for a peer: spin, then yield, then sleep. The one wait loop of the transports.

Every wait of a transport is a loop that polls for news (a piece in a slot, a
finished MPI request) and, when a poll finds nothing, asks its ``Backoff`` what
to do next:

    backoff = Backoff(spin_s, free_polls)
    while not news():
        if backoff.idle():        # True once the wait is long
            sleep_or_hand_over()  # doorbell (local.py), nap (mpi.py), general way (short_way.py)
    ...                           # progress: backoff.reset() if the loop goes on

The policy, and why:

1. **Spin** ``free_polls`` polls without pause. A message between two ranks of
   one machine is a few microseconds away; polling is the fastest way to see
   it, and a poll costs less than any handing over of the core.
2. **Yield** (``sched_yield``) after each further poll, for up to ``spin_s``
   seconds of idleness in all. A yield costs little when nobody else wants the
   core, and lets a peer that shares our core run: with more ranks than cores
   (``free_polls`` is then 1) the peer we wait for may be exactly that one.
   The short way's wait for a reply spins longer first (``REPLY_POLLS``, as
   MPICH does), because a yield may hand the core to another process of the
   machine for a whole time slice (milliseconds) where the reply needed 3 us.
3. **Sleep** once idle longer than ``spin_s``: the peer is computing, not
   communicating, and a polling rank would steal the CPU from it. How to sleep
   is the caller's: the local transport sleeps on its doorbell until a peer
   rings (doorbell.py; a wake-up costs microseconds, so it is kept for long
   waits); the MPI transport, with no doorbell, naps for doubling times up to
   ``MAX_NAP`` (``Backoff.nap``); the short ways of the local transport hand
   what is left to the general way, which sleeps on the doorbell. Between two
   sleeps the rank still polls and yields ``CLOCK_EVERY`` - 1 times, so a
   message that comes while it is awake is seen at once.

The clock is read only every ``CLOCK_EVERY`` polls (each read is a system
call's worth of time next to a poll). In the local transport a thread other
than the main one (the background thread of collectives/work.py) waits with
``spin_s`` = 0: the main thread is computing on the same core and needs the
GIL, so it sleeps at once.
"""
from __future__ import annotations

import os
import threading
import time

SPIN_S = 0.002      # seconds of idleness before a wait counts as long (transport.spin_s)
FREE_POLLS = 32     # polls before a waiting rank starts yielding its core
REPLY_POLLS = 1000  # the same, for a reply microseconds away (short_way.exchange)
CLOCK_EVERY = 32    # polls between looks at the clock
FIRST_NAP, MAX_NAP = 1e-5, 1e-3  # a long wait without doorbell: naps of 10 us doubling to 1 ms

sched_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def cores_available() -> int:
    """How many cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def free_polls(ranks_here: int, polls: int = FREE_POLLS) -> int:
    """Polls before yielding: ``polls`` when each rank has a core, 1 with more
    ranks than cores (a peer we wait for may need our core to send)."""
    return 1 if ranks_here > cores_available() else polls


def in_background_thread() -> bool:
    """Is this a thread other than the main one: the thread that runs
    asynchronous collectives (collectives/work.py), or one of the user's? Such a thread
    does not spin while it waits: the main thread is computing on the same
    core and needs the GIL, so it sleeps at once."""
    return threading.current_thread() is not threading.main_thread()


class Backoff:
    """One wait: spin ``free_polls`` polls, then yield each poll, and after
    ``spin_s`` seconds of idleness tell the caller the wait is long (see the
    module docstring for the policy and why)."""

    __slots__ = ("spin_s", "free_polls", "polls", "since", "next_nap")

    def __init__(self, spin_s: float = SPIN_S, free_polls: int = FREE_POLLS):
        self.spin_s, self.free_polls = spin_s, free_polls
        self.polls, self.since, self.next_nap = 0, None, FIRST_NAP   # as reset(), inline: hot

    def reset(self) -> None:
        """Progress was made: the next poll that finds nothing starts a new wait."""
        self.polls, self.since, self.next_nap = 0, None, FIRST_NAP

    def idle(self) -> bool:
        """Account for one poll that found nothing (yielding the core if past
        the free polls); True when the wait has been idle longer than
        ``spin_s``: the caller sleeps. Past ``spin_s`` that is at every
        ``CLOCK_EVERY``-th poll (at every one with ``spin_s`` = 0); the polls
        between still yield, so a message that comes meanwhile is seen at once."""
        polls = self.polls = self.polls + 1
        if polls >= self.free_polls:
            sched_yield()
        if polls % CLOCK_EVERY and self.spin_s:
            return False  # look at the clock only now and then
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return now - self.since >= self.spin_s

    def idle_seconds(self) -> float:
        """How long this wait has found nothing (for its timeout)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def nap(self) -> None:
        """Sleep, for a long wait with no doorbell to sleep on: 10 us, doubling to 1 ms."""
        time.sleep(self.next_nap)
        self.next_nap = min(self.next_nap * 2, MAX_NAP)
