"""The latency path: a small all-reduce in one post and N-1 reads on the board.

small.py's all-reduce gathers every rank's array in ceil(log2 N) rounds of
messages and folds them in rank order. On one machine the gathering can be
one step: every rank writes its array once into its own slot on the board
(transport/board.py), and reads its peers' arrays where they lie:

    post     slot_r = [record of r's call | x_r]; then the ticket of this call (one store)
    wait     until every peer's ticket is this call's
    check    every record equals mine       -> all ranks made the same call
    fold     x = op(x_0, x_1, ..., x_{N-1}), in rank order, straight out of the slots
    ack      tell each peer I am done with its slot (it may post again)

    T_oneshot = alpha_post + (N-1) * M / beta_read,  M copied in once, read N-1 times

    alpha_post, measured (64 bytes, all_reduce.py's table): 5.0-5.7 us at N=2, 26.8 at N=4

Every rank folds the same N arrays in the same order: every rank gets the
bits of the one-process reference, as with small.py (NCCL's "one-shot"
all-reduce, the same idea on a GPU's peer memory). The record rides in the
slot, so the same-call check costs no message.

A call does nothing else: its plan (made once per group, shape, dtype and op,
kept for the next call as ``all_reduce`` finds it, api.py) holds the views of
every slot as arrays of the caller's shape, the record, the stats fields; a
call copies in, posts, waits, compares N-1 records, folds and acknowledges.
Its bookkeeping is cut to what it buys: the clock is read once as the call
begins and once as it ends, for the flight record, the stats and the trace
alike; the stats count the call in the plan's Tally (stats.py: one more call,
its seconds); the records are compared in place, word by word (``_same_call``;
``check_posts`` copies them out, the plain way and the oracle); on NumPy the
caller's array is copied in as it is (the guard and CuPy go through
backend.to_host). docs/collectives.md ("The latency path") shows where its
time goes.

A rank that made another call takes another way and never posts. Every way
records the call in the flight recorder first (flight.py) -- this one right
after its post -- so a rank that sees a peer in this very call without a post
knows the peer is elsewhere: it then joins the same-call check's records-only
exchange (check.py), which every other way starts with, and every rank raises
CollectiveMismatchError naming who called what. Ranks that all post but
disagree see every record and raise at once. Without the check
(``check=False``) a block of another size raises MessageMismatchError.
"""
from __future__ import annotations

import time
from typing import Any

from minidist import backend
from minidist.comm.collectives.check import describe, encode, mismatch_error, verify_same_call
from minidist.comm.collectives.stats import Tally
from minidist.comm.errors import CollectiveMismatchError, MessageMismatchError
from minidist.comm.transport.base import dtype_code, dtype_name, host_view
from minidist.comm.transport.board import ticket_of
from minidist.comm.transport.reduce_op import ReduceOp, combine_fn, finish
from minidist.trace import recorder as trace


def fits(group, nbytes: int) -> bool:
    """Can an all-reduce of ``nbytes`` on ``group`` go through the board?"""
    board = group.transport.board
    return board is not None and group.size > 1 and nbytes <= board.capacity


def through_board(plan) -> bool:
    """Is ``plan`` (from all_reduce.make_plan, or None) one of the board's?"""
    return isinstance(plan, OneShotPlan)


def describe_post(plan, group, shape: tuple, dtype: Any, op: ReduceOp, algorithm: str) -> None:
    """Set on ``plan`` what an all-reduce's post on the board and ``check_posts``
    need: the call's fields (for the stats), line and record (for the check),
    its bytes M and dtype code, my global rank, my peers', and every record's view."""
    board = group.transport.board
    plan.fields = dict(op=op.name, algorithm=algorithm, dtype=dtype.name, shape=shape)
    plan.line = describe("all_reduce", **plan.fields)
    plan.record = encode(plan.line) if group.check else None    # 128 B, or no check
    count = 1
    for s in shape:
        count *= s
    plan.nbytes, plan.code = count * dtype.itemsize, dtype_code(dtype)   # M
    plan.me = group.transport.rank
    plan.peers = [q for q in group.ranks if q != plan.me]            # global ranks
    plan.records = [board.records[q] for q in group.ranks]          # (128,) uint8 each
    plan.peer_records = [board.records[q] for q in plan.peers]


class OneShotPlan:
    """What a one-shot all-reduce of one (shape, dtype, op) on one group needs."""

    def __init__(self, group, shape: tuple, dtype: Any, op: ReduceOp):
        board = group.transport.board
        n = group.size
        # The call, as the stats record it and the check compares it: the
        # algorithm is small.py's all-gather, gathered through the board.
        describe_post(self, group, shape, dtype, op, "allgather")
        # Rank q's slot as an array of the caller's shape, in group rank order.
        host = [board.data[q][:self.nbytes].view(dtype).reshape(shape) for q in group.ranks]
        self.mine = host[group.rank]
        # The same records as 16 int64 words, to compare without a copy (``_same_call``)
        self.peer_words = [memoryview(rec).cast("Q") for rec in self.peer_records]
        self.record_words = memoryview(self.record).cast("Q") if group.check else None
        # On NumPy the caller's array is a host array: it is copied in as it is.
        # The guard and CuPy copy through backend.to_host (explicitly, or to the host).
        self.numpy = backend.get_backend() == "numpy"
        # On the CPU backends from_host gives a view, made once here; on CuPy it
        # copies to the device, so it must happen on every call.
        self.on_host = backend.get_backend() != "cupy"
        self.by_rank = [backend.from_host(x) for x in host] if self.on_host else host
        self.combine, self.op = combine_fn(op), op
        self.avg = op is ReduceOp.AVG                # the fold ends with a division by N
        self.messages = n - 1                        # one post, read by N-1 peers
        moved = (n - 1) * self.nbytes                # read by each of N-1 peers; N-1 read here
        self.delta = (moved, moved, self.messages, self.messages)   # the stats of a call
        self.tally = Tally("all_reduce", self.fields, self.delta)    # its calls (stats.py)


def call(group, tensor: Any, plan: OneShotPlan) -> None:
    """``all_reduce(tensor)`` through the board: number the call, run it, count it.
    One clock reading as it begins and one as it ends serve the flight record,
    the stats and the trace alike."""
    tag = group.next_collective_tag()     # every rank numbers its calls alike
    start = time.perf_counter()
    end = board_all_reduce(group, tensor, plan, group.calls, tag, start)
    stats = group.stats
    stats.count(plan.tally, end - start)  # as stats.add(.., plan.delta, ..), in three stores
    if trace.active is not None:   # its span, with the bytes it moved (trace/)
        trace.active.call("all_reduce", group.ranks, start, stats.last, group.group_desc)


def board_all_reduce(group, tensor: Any, plan: OneShotPlan, number: int, tag: int,
                     start: float | None = None) -> float:
    """Reduce ``tensor`` in place across ``group`` (the module docstring). ``start``:
    time.perf_counter() as the call began (None: read here); returns it as it ended."""
    t = group.transport
    board = t.board
    ticket = ticket_of(group.ctx, number)
    t.board_claim(plan.line)                         # my last post has been read by all
    plan.mine[...] = tensor if plan.numpy else backend.to_host(tensor)   # copy in
    if plan.record is not None and board.posted_record is not plan.record:
        board.records[plan.me][:] = host_view(plan.record)
        board.posted_record = plan.record
    t.board_post(ticket, plan.nbytes, plan.code, plan.peers)
    t.record_begin(group.ctx, number, group.ranks, plan.line, start)   # after the post: see above
    strays = t.board_wait(plan.peers, ticket, plan.line)
    if strays:
        another_way(group, plan, strays, tag)        # raises on every rank
    if not _same_call(plan):
        check_posts(group, plan)                     # raises on every rank
    xs = plan.by_rank if plan.on_host else [backend.from_host(x) for x in plan.by_rank]
    # x = op(x_0, x_1, ..., x_{N-1}), straight out of the slots, in rank order: the
    # fold of reduce_op.fold_in_order, written out (a call less on the latency path)
    combine = plan.combine
    combine(xs[0], xs[1], tensor)
    for x in xs[2:]:
        combine(tensor, x, tensor)
    if plan.avg:
        finish(plan.op, tensor, len(xs))
    board.ack(plan.peers)                            # they may post again
    end = time.perf_counter()
    t.record_end(end)
    return end


def _same_call(plan: OneShotPlan) -> bool:
    """Does every peer's record equal mine, word for word? (False without the
    check: then ``check_posts`` compares the posts' sizes.) ``check_posts``'s first loop
    is the plain version, and the oracle: it copies each record to compare it."""
    record = plan.record_words
    if record is None:
        return False
    for rec in plan.peer_words:
        if rec != record:
            return False
    return True


def check_posts(group, plan) -> None:
    """Every peer's record equals mine (or, without the check, its block has my
    size and dtype); otherwise raise, having read what the error names and then
    acknowledged every post: every rank sees the same posts, so every rank raises.
    ``plan``: a board plan (here, twoshot.py) with the call's record, records,
    peer_records, nbytes, code, line, me and peers."""
    board = group.transport.board
    if plan.record is not None:
        record = plan.record
        for rec in plan.peer_records:
            if rec.tobytes() != record:
                break
        else:
            return
        error = mismatch_error(group, plan.records)  # read the records before the acks
        board.ack(plan.peers)                         # free the peers to post again
        raise error
    for q in plan.peers:
        nbytes, code = board.header(q)
        if nbytes != plan.nbytes or code != plan.code:
            board.ack(plan.peers)
            raise MessageMismatchError(
                f"rank {plan.me}: in {plan.line}, rank {q} posted a block of another size "
                f"({nbytes} bytes of {dtype_name(code)}) than the {plan.nbytes} bytes of "
                f"{dtype_name(plan.code)} expected (different shapes or dtypes?)")


def another_way(group, plan, strays: list[int], tag: int) -> None:
    """Some peers entered this call without posting: they made another call,
    whose first messages are the same-call check's (check.py). Acknowledge
    the posts, take back what the strays owe, and join the records-only
    check, which raises CollectiveMismatchError on every rank. ``plan``: a
    board plan (here, alltoall_board.py) with the call's line, me and peers."""
    board = group.transport.board
    for q in strays:
        board.forgive(q)
    board.ack([q for q in plan.peers if q not in strays])
    if not group.check:
        raise MessageMismatchError(
            f"rank {plan.me}: in {plan.line}, ranks {strays} made another call (the group "
            f"has check=False, so the calls cannot be compared)")
    verify_same_call(group, plan.line, tag)
    raise CollectiveMismatchError(f"rank {plan.me}: in {plan.line}, ranks {strays} took "
                                  f"another way, but the same-call check found no difference")
