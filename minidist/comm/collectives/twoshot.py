"""Two-shot all-reduce through the board: reduce-scatter, then all-gather, in the slots.

The one-shot all-reduce (oneshot.py) has every rank read all N posted arrays
and fold them: each rank reads N * M bytes and writes (N-1) * M folding them,
which at a megabyte and four ranks is the whole cost. Split the fold instead,
as a reduce-scatter then an all-gather on the shared segment (NCCL's
"two-shot" all-reduce; MPICH's shared-memory reduce-scatter + allgather):

    post     slot_r = [record | x_r]; then the ticket (transport/board.py)
    wait     until every peer's ticket is this call's; check every record
    reduce   rank r owns chunk c_r (ring.py's chunk_bounds):
                 x[c_r] = op(x_0[c_r], x_1[c_r], ..., x_{N-1}[c_r])   (AVG: / N)
             folded in rank order into the caller's array, then written over
             c_r of its own slot (nobody else reads c_r of slot r)
    done     raise the post's second flag (``T_DONE``); wait for every peer's
    gather   x[c_q] = slot_q[c_q] for every q != r
    ack      done with every slot (the next post may overwrite it)

An array larger than a slot's capacity goes through in pieces of that
capacity, one round (post, wait, reduce, done, gather, ack) per piece; round
k > 0 posts a ticket marked with k (``round_ticket``), so a peer never mistakes
a round's post for the last one's.

Bytes per rank, for an array of M bytes at N ranks (one piece):

    copied in M,  read to reduce N * M/N = M,  written M/N (+ M/N into the slot),
    copied out (N-1)/N * M                     -- about half the one-shot's traffic
    T_twoshot = 2 alpha_board * ceil(M / C) + (M + M + 2(N-1)/N * M) / beta_mem

with C the slot's capacity (1 MiB) and alpha_board the board's flag. Its
alpha, measured at 64 bytes beside the one-shot's in the same run (all_reduce.py,
load average 5.7: indicative): 10.7 against 5.8 us at N=2, 240 against 130 at
N=4 (two ranks per core): two posts' worth. So auto takes it only where the
bytes dominate: from 256 KiB at N=4 (all_reduce.THRESHOLDS).

Every chunk is folded once, by its owner, in rank order 0..N-1, and copied:
every rank gets the same bits, those of the naive all-reduce and of the
one-shot fold (which fold in the same order).

Failure behaves as on the one-shot path: the record rides in the slot and is
compared after the first wait (a mismatch raises CollectiveMismatchError on
every rank, or MessageMismatchError with ``check=False``); a peer that made
another call never posts, and the ranks join the same-call check
(``oneshot.another_way``); a peer that never comes, or dies between the two
flags, is named by the board's wait within the timeout, with the flight
recorder's report.
"""
from __future__ import annotations

import time
from typing import Any

from minidist import backend
from minidist.comm.collectives import oneshot
from minidist.comm.collectives.call import _flat
from minidist.comm.collectives.check import cached_plan
from minidist.comm.collectives.ring import chunk_bounds
from minidist.comm.transport.base import host_view
from minidist.comm.transport.board import T_DONE, ticket_of
from minidist.comm.transport.reduce_op import ReduceOp, combine_fn, finish
from minidist.trace import recorder as trace


def round_ticket(ticket: int, k: int) -> int:
    """The ticket of round ``k`` of the call of ``ticket``: the call's own in
    round 0; marked with 1..255 in bits 48-55 after it, so consecutive rounds
    differ and no later round reads as a call of its group (group contexts
    are small numbers; board.py's waits look strays up only by round 0's)."""
    if k == 0:
        return ticket
    return ticket ^ ((1 + (k - 1) % 255) << 48)


class TwoShotPlan:
    """What a two-shot all-reduce of one (shape, dtype, op) on one group needs."""

    def __init__(self, group, shape: tuple, dtype: Any, op: ReduceOp):
        board = group.transport.board
        n, r = group.size, group.rank
        oneshot.describe_post(self, group, shape, dtype, op, "twoshot")   # as the one-shot's
        count = self.nbytes // dtype.itemsize
        per_round = max(1, board.capacity // dtype.itemsize)        # elements per piece
        # The pieces of the array, one round each: [(lo, hi)], at least one.
        self.pieces = [(lo, min(lo + per_round, count)) for lo in range(0, count, per_round)]
        self.pieces = self.pieces or [(0, 0)]
        # Rank q's slot as a 1-D array of the dtype, in group rank order.
        self.slots = [board.data[q][:per_round * dtype.itemsize].view(dtype)
                      for q in group.ranks]
        self.on_host = backend.get_backend() != "cupy"   # from_host is a view: made once
        if self.on_host:
            self.slots = [backend.from_host(x) for x in self.slots]
        self.n, self.rank = n, r
        self.combine, self.op = combine_fn(op), op
        messages = 2 * (n - 1) * len(self.pieces)   # two flags per round, seen by N-1
        moved = 0          # bytes of mine read by peers = bytes I read of theirs
        for lo, hi in self.pieces:
            bounds = chunk_bounds(hi - lo, n)
            mine = bounds[r][1] - bounds[r][0]
            # reduce: the peers read the chunks of my post not mine (I, mine of theirs);
            # gather: N-1 peers read my reduced chunk (I, their N-1 chunks)
            moved += ((hi - lo - mine) + (n - 1) * mine) * dtype.itemsize
        self.delta = (moved, moved, messages, messages)   # the stats of a call


def plan_for(group, tensor: Any, op: ReduceOp) -> TwoShotPlan:
    """The plan of a two-shot all-reduce of ``tensor`` with ``op``, made on first use."""
    return cached_plan(group, ("twoshot", tensor.shape, tensor.dtype, op), TwoShotPlan,
                       group, tensor.shape, tensor.dtype, op)


def cannot_run(group) -> str | None:
    """Why ``group`` has no board to reduce on (MPI, an emulated link,
    MINIDIST_BOARD=0), or None."""
    if group.transport.board is None:
        return (f"the {group.transport.name} transport has no board (one machine, no "
                f"emulated link, MINIDIST_BOARD not 0)")
    return None


def through_board(plan) -> bool:
    """Is ``plan`` (from all_reduce.make_plan, or None) a two-shot plan?"""
    return isinstance(plan, TwoShotPlan)


def call(group, tensor: Any, plan: TwoShotPlan) -> None:
    """``all_reduce(tensor)`` in two shots: number the call, run it, count it
    (as oneshot.call: the flight recorder notes the call only after the first
    post, so a peer never takes it for a rank gone another way)."""
    tag = group.next_collective_tag()              # every rank numbers its calls alike
    start = time.perf_counter()
    flat, write_back = _flat(tensor)
    twoshot_all_reduce(group, flat, plan, group.calls, tag)
    write_back()
    stats = group.stats
    stats.add("all_reduce", plan.fields, plan.delta, time.perf_counter() - start)
    if trace.active is not None:   # its span, with the bytes it moved (trace/)
        trace.active.call("all_reduce", group.ranks, start, stats.last, group.group_desc)


def twoshot_all_reduce(group, flat: Any, plan: TwoShotPlan, number: int, tag: int) -> None:
    """Reduce the 1-D contiguous ``flat`` in place across ``group`` (the module
    docstring), a round per piece of the slot's size; ``number``, ``tag``: the
    call's (the tag for the same-call check, should a peer go another way)."""
    t = group.transport
    ticket = ticket_of(group.ctx, number)
    for k, (lo, hi) in enumerate(plan.pieces):
        _round(group, flat[lo:hi], plan, round_ticket(ticket, k), tag,
               number if k == 0 else None)
    t.record_end()


def _round(group, piece: Any, plan: TwoShotPlan, ticket: int, tag: int,
           number: int | None) -> None:
    """One round on ``piece`` (at most a slot of elements): post, reduce my chunk,
    flag it, gather the others' chunks, acknowledge. ``number``: in the first
    round, the call's, noted in the flight recorder right after the post."""
    t = group.transport
    board = t.board
    k, n, r = piece.size, plan.n, plan.rank
    slots = plan.slots if plan.on_host else [backend.from_host(x) for x in plan.slots]
    t.board_claim(plan.line)                       # my last post has been read by all
    slots[r][:k] = piece                           # copy in
    if plan.record is not None and board.posted_record is not plan.record:
        board.records[plan.me][:] = host_view(plan.record)
        board.posted_record = plan.record
    t.board_post(ticket, plan.nbytes, plan.code, plan.peers)
    if number is not None:                         # after the first post: see oneshot.py
        t.record_begin(group.ctx, number, group.ranks, plan.line)
    strays = t.board_wait(plan.peers, ticket, plan.line)
    if strays:                                     # round 0 only: all post in later ones
        oneshot.another_way(group, plan, strays, tag)   # raises on every rank
    oneshot.check_posts(group, plan)               # raises on every rank
    bounds = chunk_bounds(k, n)
    lo, hi = bounds[r]
    # x[c_r] = op(x_0[c_r], ..., x_{N-1}[c_r]), in rank order, into the caller's array
    out = piece[lo:hi]
    plan.combine(slots[0][lo:hi], slots[1][lo:hi], out)
    for q in range(2, n):
        plan.combine(out, slots[q][lo:hi], out)
    finish(plan.op, out, n)
    slots[r][lo:hi] = out                          # published over my own chunk
    t.board_done(ticket, plan.peers)
    t.board_wait(plan.peers, ticket, plan.line, word=T_DONE)
    for q in range(n):                             # gather every other rank's chunk
        if q != r:
            qlo, qhi = bounds[q]
            piece[qlo:qhi] = slots[q][qlo:qhi]
    board.ack(plan.peers)                          # they may post again
