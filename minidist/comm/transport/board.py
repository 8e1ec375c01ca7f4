"""The board: one slot per rank in the world's segment, that every peer reads.

A message through a channel (local.py) is written by its sender into the
channel to one peer and copied out by that peer: to give a block to N-1 peers
a rank writes it N-1 times, and a collective of small blocks pays, per round,
a slot header, a bell, a poll and a copy out. For a block of a few kilobytes
that is the whole cost (docs/collectives.md, "The latency path"). The board
lets a rank write its block once, where every peer reads it in place:

    slot of rank r:  [ticket, nbytes, dtype code, done | acks: one word per rank |
                      record (128 B) | data (capacity bytes)]

    claim    wait until every peer that was to read r's last post has said so
             (its word in its own ``acks`` row counts the posts of r it is done with)
    post     write the record and the data, then the ticket (one store): the
             call's (group context, call number), which no other call has
    read     wait until a peer's ticket is this call's, then read its record
             and data straight out of its slot (the fold of small.py, say)
    ack      acks[q] += 1 in my slot: I am done with q's post

A collective in two steps (the two-shot all-reduce, collectives/twoshot.py)
raises a second flag in the same post: ``done``, set to the post's ticket once
the rank has written its step's result into its slot; a peer waits for it as
for the ticket (``board_wait(..., word=T_DONE)``). The ticket stays as it was,
so a slow peer still sees the post it waits for.

One writer per word: a rank writes only its own slot (its ticket, its data,
its row of acks), so no lock is needed, and on x86 stores become visible in
program order, so the data are complete when a reader sees the ticket. A
rank posts again only after every reader acknowledged its last post, so a
post is never overwritten while it is read; a reader acknowledges right after
reading, without waiting for anything, so the claim is nearly always free.

Each process runs one collective at a time (collectives/work.py runs a
synchronous call only after the queued ones), so one slot per rank serves
every group. The waits (``BoardWays``, mixed into LocalTransport) follow
wait.py: poll, yield, then sleep on the doorbell, which a post rings; a wait
checks the abort word and raises CommTimeoutError with the flight recorder's
report after the timeout, like every wait of the transport.
``MINIDIST_BOARD=0`` leaves the board out (bench_latency.py compares both ways).
"""
from __future__ import annotations

import os

from minidist.comm.errors import TIMEOUT_HINT, CommTimeoutError
from minidist.comm.transport import flight
from minidist.comm.transport.base import host_view
from minidist.comm.transport.wait import Backoff

BOARD_BYTES = 1 << 20   # data bytes per rank (at most a channel's slot_bytes: shm.create);
# 1 MiB: an all-to-all input of 256 KiB fits (one of 1 MiB, which single-copy
# reads serve, does not: its counts take the first cache line). At 256 KiB, world
# 2, the board took 33.0 us, single-copy reads 44.1 and the pairwise exchange
# 35.7 (bench_alltoall's call, best of 4 alternating runs, load average 6)
RECORD_BYTES = 128       # the same-call check's record (collectives/check.py)
HEAD_BYTES = 64          # ticket, nbytes, dtype code, done: one cache line
T_TICKET, T_NBYTES, T_CODE, T_DONE = range(4)
ACK_NAP_S = 1e-3         # a long wait for acks naps this long (readers do not ring)


def board_wanted() -> bool:
    """False under MINIDIST_BOARD=0: the small collectives then take the channels."""
    return os.environ.get("MINIDIST_BOARD", "1") != "0"


def ack_bytes(world_size: int) -> int:
    return -(-world_size * 8 // 64) * 64


def slot_bytes(world_size: int, capacity: int) -> int:
    """Bytes of one rank's slot: head, acks, record, data (64-byte aligned)."""
    return HEAD_BYTES + ack_bytes(world_size) + RECORD_BYTES + -(-capacity // 64) * 64


def ticket_of(ctx: int, number: int) -> int:
    """The ticket of call ``number`` of the group with context ``ctx``: unique per call."""
    return (ctx << 32) | (number & 0xFFFFFFFF)


class Board:
    """The slots of every rank at ``offset`` in the segment ``buf``, seen from ``rank``."""

    def __init__(self, buf: memoryview, offset: int, world_size: int, rank: int,
                 capacity: int):
        n = world_size
        self.world_size, self.rank, self.capacity = n, rank, capacity
        stride = slot_bytes(n, capacity)
        self._words = buf[offset:offset + n * stride].cast("q")
        data = host_view(buf)
        self.head = [q * stride // 8 for q in range(n)]      # rank q's first word
        self.acks = [h + HEAD_BYTES // 8 for h in self.head]    # row of acks of rank q
        start = [offset + q * stride + HEAD_BYTES + ack_bytes(n) for q in range(n)]
        self.records = [data[s:s + RECORD_BYTES] for s in start]           # (128,) uint8
        self.data = [data[s + RECORD_BYTES:s + RECORD_BYTES + capacity] for s in start]
        self.owed = [0] * n      # posts of mine each rank is to have read (acked) by now
        self.readers: list[int] = []   # the ranks that were to read my last post
        self.posted_record = None   # the record bytes in my slot now (written when they change)

    def ticket(self, q: int) -> int:
        return self._words[self.head[q] + T_TICKET]

    def header(self, q: int) -> tuple[int, int]:
        """(nbytes, dtype code) of rank q's post."""
        w, h = self._words, self.head[q]
        return w[h + T_NBYTES], w[h + T_CODE]

    def unacked(self) -> list[int]:
        """The ranks that have not yet acknowledged every post of mine they were to read."""
        w, me, owed = self._words, self.rank, self.owed
        return [q for q in self.readers if w[self.acks[q] + me] < owed[q]]

    def all_read(self) -> bool:
        """Has every reader of my last post acknowledged it? (``unacked`` is
        empty; a loop that stops early, for the call path.)"""
        w, me, owed, acks = self._words, self.rank, self.owed, self.acks
        for q in self.readers:
            if w[acks[q] + me] < owed[q]:
                return False
        return True

    def all_posted(self, peers: list[int], ticket: int, word: int = T_TICKET) -> bool:
        """Does every slot of ``peers`` hold ``ticket`` (in ``word``: T_TICKET, the
        post, or T_DONE, its second flag)? (``waiting_for`` is empty.)"""
        w, head = self._words, self.head
        for q in peers:
            if w[head[q] + word] != ticket:
                return False
        return True

    def waiting_for(self, peers: list[int], ticket: int, word: int = T_TICKET) -> list[int]:
        """The ranks among ``peers`` whose slot does not hold ``ticket`` (in ``word``) yet."""
        w, head = self._words, self.head
        return [q for q in peers if w[head[q] + word] != ticket]

    def publish(self, ticket: int, nbytes: int, code: int, readers: list[int]) -> None:
        """Post what the caller wrote into ``data[rank]`` (and the record): the
        header, then the ticket. ``readers``: the global ranks that will read it."""
        w, h = self._words, self.head[self.rank]
        for q in readers:
            self.owed[q] += 1
        self.readers = readers
        w[h + T_NBYTES], w[h + T_CODE] = nbytes, code
        w[h + T_TICKET] = ticket

    def flag_done(self, ticket: int) -> None:
        """Raise my post's second flag: what I wrote into my slot after reading
        the peers' posts of ``ticket`` is complete (twoshot.py)."""
        self._words[self.head[self.rank] + T_DONE] = ticket

    def forgive(self, q: int) -> None:
        """Rank q will not read my last post after all (it took another way)."""
        self.owed[q] -= 1

    def ack(self, peers: list[int]) -> None:
        """I am done with the posts of ``peers``."""
        w, row = self._words, self.acks[self.rank]
        for q in peers:
            w[row + q] += 1

    def release(self) -> None:
        self.records = self.data = []
        self._words.release()


class BoardWays:
    """Mixed into LocalTransport (local.py): the waits of the board, with its
    doorbells, abort word, timeout and flight recorder."""

    def board_claim(self, what: str) -> None:
        """Wait until every reader of my last post has acknowledged it."""
        board = self.board
        if board.all_read():      # nearly always: readers acknowledge as they finish
            return
        # A reader microseconds from its ack: spin as long as for a reply before
        # yielding (wait.py), or a yield may cost a time slice per call.
        backoff = Backoff(self.spin_s, self.reply_polls)
        while True:
            late = board.unacked()
            if not late:
                return
            if not backoff.idle():
                if self._death_unseen():   # a death marked: check it now (local_wait.py)
                    self._check_abort()
                continue
            self._check_abort()
            if backoff.idle_seconds() > self.timeout:
                raise self._board_timeout(
                    f"ranks {late} have not finished reading this rank's last post on "
                    f"the board", what)
            self._bells.wait(self.rank, self._bells.value(self.rank), ACK_NAP_S)

    def board_post(self, ticket: int, nbytes: int, code: int, readers: list[int]) -> None:
        """Publish my post (data and record written) and ring the readers' bells."""
        self.board.publish(ticket, nbytes, code, readers)
        ring = self._bells.ring
        for q in readers:
            ring(q)

    def board_done(self, ticket: int, readers: list[int]) -> None:
        """Raise my post's second flag (``Board.flag_done``) and ring the readers' bells."""
        self.board.flag_done(ticket)
        ring = self._bells.ring
        for q in readers:
            ring(q)

    def board_wait(self, peers: list[int], ticket: int, what: str,
                   word: int = T_TICKET) -> list[int]:
        """Wait until every rank in ``peers`` (global) posted ``ticket`` (or, with
        ``word=T_DONE``, raised the post's second flag). Returns [] then, or the
        peers that entered this very call (flight recorder) without posting: they
        took another way (a different call; the caller checks)."""
        board = self.board
        if board.all_posted(peers, ticket, word):
            return []
        pending = peers
        backoff = Backoff(self.spin_s, self.reply_polls)
        while True:
            pending = board.waiting_for(pending, ticket, word)
            if not pending:
                return []
            if not backoff.idle():
                if self._death_unseen():   # a death marked: check it now (local_wait.py)
                    self._check_abort()
                continue
            self._check_abort()
            if word == T_TICKET:      # a peer past its post is in this call: no stray
                strays = self._strays(pending, ticket)
                if strays is not None:
                    return strays
            if backoff.idle_seconds() > self.timeout:
                waiting = "posts" if word == T_TICKET else "second flags"
                raise self._board_timeout(f"waiting for the {waiting} of ranks {pending} on "
                                          f"the board", what)
            self._board_sleep(pending, ticket, word)

    def _strays(self, pending: list[int], ticket: int) -> list[int] | None:
        """If every pending peer entered the call of ``ticket`` (flight recorder)
        without posting, those peers; else None (some are still on their way)."""
        ctx, number = ticket >> 32, ticket & 0xFFFFFFFF
        records = self._flight_records()
        # A peer posts before it records the call, so one that recorded it and
        # has still no post on the board is on another way.
        if all(records[q].entered(ctx, number) for q in pending):
            return self.board.waiting_for(pending, ticket) or None
        return None

    def _board_sleep(self, pending: list[int], ticket: int, word: int = T_TICKET) -> None:
        """Sleep on my doorbell until a peer rings (a post rings it), at most 50 ms."""
        bells, me = self._bells, self.rank
        seen = bells.value(me)
        bells.sleepers(me, +1)
        try:
            if self.board.waiting_for(pending, ticket, word) == pending:
                bells.wait(me, seen, 0.05)
        finally:
            bells.sleepers(me, -1)

    def _board_timeout(self, waiting: str, what: str) -> CommTimeoutError:
        report = flight.hang_report(self._flight_records(), self.rank)
        where = f" in {what}" if what else ""
        return CommTimeoutError(f"rank {self.rank}: waited {self.timeout:g} s{where}, "
                                f"{waiting}\n{report}\n{TIMEOUT_HINT}")

