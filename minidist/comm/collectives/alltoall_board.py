"""All-to-all through the board: the split sizes and small inputs in one post.

alltoall.py's all-to-all starts with the same-call check, a Bruck all-gather of every rank's record
and row and column of the split matrix S, in ceil(log2 N) rounds; then the parts move, pairwise
(N-1 more steps) or by single-copy reads. For small parts those rounds are the whole cost. On one
machine every rank posts instead, once, into its slot on the board (transport/board.py):

    slot of rank q = [record | S[q][:] (N) | S[:][q] (N) | fits, pid, address | input of q]

    post      the counts, and the input when it fits the slot (``fits``)
    wait      until every peer posted this call's ticket
    check     every record equals mine, S[i][j] as i says it = as j says it
    move      every input fits:  rank r copies part r of each rank's input out
                                 of its slot (offsets(S[q])[r] rows on), in rank order
              at 4 ranks, inputs to 4 MiB: the same, a piece a round (alltoall_rounds.py)
              otherwise:         single-copy reads or the pairwise exchange
                                 (alltoall.py), with S and the addresses as posted
    ack       done with every slot

    T_board = alpha_post + sum_q S[q][r] * row / beta   (rank r, every input fitting)

Every rank sees every post, so every rank decides the same: the same way to move the parts, the
same ``CollectiveMismatchError`` when the splits disagree (the pair is named, as alltoall.py names
it). A peer that made another call never posts; as with oneshot.py, the flight recorder shows it in
this call without a post, and the ranks join the records-only check, so all raise.

A call with the split sizes of an earlier call (a Ulysses layer, a loop of the same shapes) repeats
its work: its ``SplitPlan``, kept per (shapes, dtypes, splits) where ``all_to_all_single`` looks
first (api.py: the arrays' checks ran when it was made), holds the counts to post, the offsets, and
the S agreed last time with the parts of the slots to copy out. Those parts, in rank order, are the
caller's output: a slice copy each puts them in it (any strides). Such a call
(``SplitPlan.repeat``) writes its counts only when another call wrote over them, and compares each
peer's record and counts with those of the last agreed call byte for byte, in one pass (the same-
call check of the call and its splits, on every call); only if they differ are the records checked
alone and the counts parsed. A rank that expects every input on the board offers no address (pid
0): if a peer's splits then say otherwise, the parts move pairwise.
"""
from __future__ import annotations

import time
from typing import Any, NamedTuple

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives import alltoall_rounds, oneshot
from minidist.comm.collectives.alltoall import offsets, parse_counts, split_sizes
from minidist.comm.collectives.call import _flat
from minidist.comm.collectives.check import (cached_plan, describe, encode, keep_plan,
                                             mismatch_error)
from minidist.comm.collectives.stats import Tally
from minidist.comm.transport.base import host_view
from minidist.comm.transport.board import ticket_of
from minidist.trace import recorder as trace

FITS, PID, ADDRESS = range(3)   # the words after the 2N counts
MAX_SPLIT_PLANS = 16            # split plans kept per (dtype, row shape); a loop has a few
# From this many input bytes, the part a rank keeps goes from its input to its
# output in one copy instead of through its slot (two): below, the slicing that
# takes costs more than the copy it saves (a 1 KiB call is a few microseconds).
KEEP_DIRECT_BYTES = 32 * 1024


def usable(group) -> bool:
    """Does ``group`` have a board to post on (one machine, the check on)?"""
    return group.transport.board is not None and group.size > 1 and group.check


class BoardAllToAllPlan:
    """What an all-to-all of one (dtype, row shape) on one group needs on the board."""

    def __init__(self, group, dtype: Any, row_shape: tuple):
        board = group.transport.board
        n = group.size
        self.fields = dict(dtype=dtype.name, row_shape=row_shape)
        self.line = describe("all_to_all_single", **self.fields)
        self.record = encode(self.line)
        self.me = group.transport.rank
        self.peers = [q for q in group.ranks if q != self.me]
        self.words = 2 * n + 3                             # S row, S column, fits, pid, address
        head = -(-self.words * 8 // 64) * 64               # the input starts on a cache line
        # Group rank q's slot: its counts (int64) and its input (bytes).
        self.counts = [board.data[q][:self.words * 8].view("int64") for q in group.ranks]
        self.agreed_words = [c[:2 * n + 1] for c in self.counts]   # S row, S column, fits
        self.peer_words = [w for q, w in enumerate(self.agreed_words) if q != group.rank]
        self.inputs = [board.data[q][head:] for q in group.ranks]
        self.records = [board.records[q] for q in group.ranks]
        self.peer_records = [board.records[q] for q in self.peers]
        self.dtype = dtype
        self.room = board.capacity - head                  # input bytes a slot holds
        self.way = alltoall_rounds.RoundsWay(board, n, self.inputs, self.room, dtype)
        self.split_plans: dict = {}                        # (send, recv) -> SplitPlan


class OutputBlock(NamedTuple):
    """Where one rank's part, in its slot, goes in my output (rows along axis 0)."""
    lo: int        # first output row
    hi: int        # one past the last
    part: Any      # the part in the rank's slot, (hi - lo, *row_shape)


class SplitPlan:
    """One call's split sizes on a BoardAllToAllPlan: what to post, and what
    the peers posted the last time a call with these splits agreed."""

    def __init__(self, group, plan: BoardAllToAllPlan, send: list[int], recv: list[int],
                 row: int, in_shape: tuple):
        self.plan = plan
        self.send, self.recv, self.row = send, recv, row   # rows; elements per row
        self.in_edges, self.out_edges = offsets(send), offsets(recv)
        self.nbytes = self.in_edges[-1] * row * plan.dtype.itemsize       # my input
        self.fits = self.nbytes <= plan.room
        self.streams = not self.fits and plan.way.takes(self.nbytes)   # piece 0 in the post
        self.my_input = (plan.inputs[group.rank][:self.nbytes].view(plan.dtype)
                         .reshape(in_shape)) if self.fits else None   # my input, in my slot
        # Large inputs on NumPy: only the parts for the peers go into the slot,
        # the rows before and after the part I keep (rows keep[0]..keep[1]).
        self.keep = (self.in_edges[group.rank], self.in_edges[group.rank + 1])
        self.numpy = backend.get_backend() == "numpy"      # arrays are NumPy's
        self.keep_direct = self.fits and self.nbytes >= KEEP_DIRECT_BYTES and self.numpy
        self.posted = plan.counts[group.rank].copy()       # the words I post (host int64)
        self.posted[:] = send + recv + [int(self.fits), 0, 0]
        self.posted_bytes = self.posted.tobytes()          # to see them still in my slot
        self.seen: list[bytes] | None = None   # each peer's S row, column, fits, last agreed
        self.parts: list = []                  # (out lo, out hi, slot part) in rank order
        self.blocks: list = []                 # OutputBlocks in rank order (NumPy's copy out)
        self.row_shape = in_shape[1:]
        self.everyone_fits = False
        # The next call repeats the last agreed one: every input in the slots, NumPy,
        self.repeat = False      # my part through my slot (no address, no direct copy)
        self.sends: list = []
        self.on_host = backend.get_backend() != "cupy"    # from_host: a view, or a copy
        self.tally: Tally | None = None        # the calls off the slots (stats.py), once agreed

    def agree(self, group, sends: list[list[int]]) -> None:
        """Keep S, as agreed by this call's posts, and the parts it puts in the slots."""
        plan, r, n = self.plan, group.rank, group.size
        self.seen = [w.tobytes() for w in plan.peer_words]   # mine: what I posted
        self.expected = list(zip(plan.peer_records, plan.peer_words, self.seen))  # per peer
        self.sends = sends
        self.everyone_fits = all(plan.counts[q][2 * n + FITS] for q in range(n))
        self.repeat = self.everyone_fits and self.numpy and not self.keep_direct
        step = self.row * plan.dtype.itemsize              # bytes per row
        self.rounds = plan.way.rounds(sends, self.row, r, self.out_edges, self.everyone_fits)
        self.parts, self.blocks = [], []
        for q in range(n if self.everyone_fits else 0):
            lo = sum(sends[q][:r]) * step
            part = plan.inputs[q][lo:lo + sends[q][r] * step].view(plan.dtype)
            self.parts.append((self.out_edges[q] * self.row, self.out_edges[q + 1] * self.row,
                               backend.from_host(part) if self.on_host else part))
            self.blocks.append(OutputBlock(self.out_edges[q], self.out_edges[q + 1],
                                           part.reshape((sends[q][r],) + self.row_shape)))
        delta_sent = (self.in_edges[n] - (self.in_edges[r + 1] - self.in_edges[r])) * step
        delta_recv = (self.out_edges[n] - (self.out_edges[r + 1] - self.out_edges[r])) * step
        self.tally = Tally("all_to_all_single", plan.fields, (delta_sent, delta_recv, n - 1, n - 1))


def board_plan(group, dtype: Any, row_shape: tuple) -> BoardAllToAllPlan:
    return cached_plan(group, ("all_to_all_single board", dtype, row_shape), BoardAllToAllPlan,
                       group, dtype, row_shape)


def call_key(input: Any, output: Any, input_split_sizes, output_split_sizes) -> tuple:
    """The key of a call's SplitPlan in ``group.small_plans``: what it depends on."""
    return ("all_to_all_single call", input.shape, output.shape, input.dtype, output.dtype,
            None if input_split_sizes is None else tuple(input_split_sizes),
            None if output_split_sizes is None else tuple(output_split_sizes))


def split_plan(group, key: tuple, input: Any, output: Any, input_split_sizes,
               output_split_sizes) -> SplitPlan:
    """Make the SplitPlan of a call (its splits checked against the arrays),
    keep it in its BoardAllToAllPlan and, for the next call, in
    ``group.small_plans`` under ``key`` (``call_key``; at most MAX_SPLIT_PLANS
    there per group)."""
    plan = board_plan(group, input.dtype, tuple(input.shape[1:]))
    send = split_sizes(input_split_sizes, input.shape[0], group.size, "input")
    recv = split_sizes(output_split_sizes, output.shape[0], group.size, "output")
    row = 1
    for s in input.shape[1:]:
        row *= s
    if len(plan.split_plans) >= MAX_SPLIT_PLANS:   # splits that change every call
        for old in plan.split_plans:
            group.small_plans.pop(old, None)
        plan.split_plans.clear()
    made = plan.split_plans[key] = SplitPlan(group, plan, send, recv, row, tuple(input.shape))
    keep_plan(group, key, made)
    return made


def call(group, output: Any, input: Any, sp: SplitPlan, source_of, move) -> None:
    """``all_to_all_single`` through the board: number the call, run it, count it.
    ``source_of(group, flat_in, flat_out)``: my (pid, address) for single-copy
    reads (alltoall.py). ``move(group, flat_in, in_edges, flat_out, out_edges,
    row, S, sources, tag, None)`` moves the parts when some input is not on the
    board (api.py)."""
    tag = group.next_collective_tag()
    start = time.perf_counter()   # one reading for the flight record, stats and trace
    stats = group.stats
    before = board_all_to_all(group, output, input, sp, source_of, group.calls, tag, move, start)
    end = time.perf_counter()
    group.transport.record_end(end)
    if before is None:
        stats.count(sp.tally, end - start)
    else:
        stats.record("all_to_all_single", before, sp.plan.fields, end - start)
    if trace.active is not None:
        trace.active.call("all_to_all_single", group.ranks, start, stats.last, group.group_desc)


def board_all_to_all(group, output: Any, input: Any, sp: SplitPlan, source_of,
                     number: int, tag: int, move, start: float | None = None) -> tuple | None:
    """Move part j of ``input`` to rank j (the module docstring; the flight record:
    begun at ``start``, ended by the caller). None when the parts came out of the
    slots (``sp.tally`` counts the call), else the stats' snapshot from before."""
    t = group.transport
    plan = sp.plan
    ticket = ticket_of(group.ctx, number)
    t.board_claim(plan.line)
    direct = False
    if sp.repeat:        # as the last call with these splits: no address, no direct part
        mine = plan.counts[group.rank]
        if mine.tobytes() != sp.posted_bytes:    # another call wrote over them since
            mine[:] = sp.posted
        sp.my_input[...] = input                           # copy in, in any layout
        _post_record(group, plan, ticket, sp.nbytes)
    else:                # my part straight from my input to my output, unless they overlap
        direct = sp.keep_direct and not xp.may_share_memory(input, output)
        _post(group, sp, output, input, direct, source_of, ticket)
    t.record_begin(group.ctx, number, group.ranks, plan.line, start)  # after the post (oneshot.py)
    strays = t.board_wait(plan.peers, ticket, plan.line)
    if strays:
        oneshot.another_way(group, plan, strays, tag)          # raises on every rank
    if sp.repeat and _as_agreed(sp):                           # the latency path's end
        _copy_out(group, sp, output, input, False)
        t.board.ack(plan.peers)
        return None
    return _settle(group, output, input, sp, direct, tag, move, ticket)


def _settle(group, output: Any, input: Any, sp: SplitPlan, direct: bool, tag: int,
            move, ticket: int) -> tuple | None:
    """A call off the repeat path, after the wait: check the records and S, move the parts."""
    t = group.transport
    board, plan = t.board, sp.plan
    _check_records(group, plan)                                # raises on every rank
    if not _as_agreed(sp):
        sources = _agree(group, sp)                            # raises on every rank
        if not sp.everyone_fits and sp.rounds is None:
            board.ack(plan.peers)    # S and the addresses are read: the slots may change
            before = group.stats.snapshot()
            flat_out, write_back = _flat(output)
            move(group, xp.ascontiguousarray(input).reshape(-1), sp.in_edges, flat_out,
                 sp.out_edges, sp.row, sp.sends, sources, tag, None)
            write_back()
            return before
    if sp.rounds is not None:                                  # the rest of the rounds
        return plan.way.finish(group, sp.rounds, input, output, ticket, plan.line, plan.peers)
    _copy_out(group, sp, output, input, direct)
    board.ack(plan.peers)
    return None


def _post(group, sp: SplitPlan, output: Any, input: Any, direct: bool, source_of,
          ticket: int) -> None:
    """Write my counts (and my address, while a call may need it), my record
    and, when it fits, my input into my slot, then the ticket. ``direct``:
    only the parts for the peers, not the one I keep."""
    plan = sp.plan
    n = group.size
    mine = plan.counts[group.rank]
    mine[:] = sp.posted
    if not (sp.seen is not None and (sp.everyone_fits or sp.rounds)):   # an address
        flat_in = xp.ascontiguousarray(input).reshape(-1)               # is worth offering
        mine[2 * n + PID:2 * n + ADDRESS + 1] = source_of(group, flat_in, output)
    if direct:               # copy in the parts for the peers, in any layout
        lo, hi = sp.keep
        sp.my_input[:lo] = input[:lo]
        sp.my_input[hi:] = input[hi:]
    elif sp.fits:                                         # copy in, in any layout
        sp.my_input[...] = input if sp.numpy else backend.to_host(input)
    elif sp.streams:                                      # round 0's piece (alltoall_rounds.py)
        plan.way.first_piece(group.rank, input)
    _post_record(group, plan, ticket, sp.nbytes)


def _post_record(group, plan: BoardAllToAllPlan, ticket: int, nbytes: int) -> None:
    board = group.transport.board    # my record (unless my slot holds it), then the ticket
    if board.posted_record is not plan.record:
        board.records[plan.me][:] = host_view(plan.record)
        board.posted_record = plan.record
    group.transport.board_post(ticket, nbytes, 0, plan.peers)


def _copy_out(group, sp: SplitPlan, output: Any, input: Any, direct: bool) -> None:
    """x_out = [part r of rank 0's input | part r of rank 1's | ...]: on NumPy
    one slice copy per part, out of its slot into its rows of the output (any
    strides; ``direct``: mine from my input). At a few KiB a slice copy per
    part costs less than one ``concatenate`` of them (0.41 us against 0.61 at
    world 2, 1 KiB: concatenate's dispatch is the most of it)."""
    if sp.numpy:
        blocks = sp.blocks
        if direct:                                 # my part is not in my slot
            lo, hi, _ = blocks[group.rank]
            blocks = list(blocks)
            blocks[group.rank] = OutputBlock(lo, hi, input[sp.keep[0]:sp.keep[1]])
        for lo, hi, part in blocks:
            output[lo:hi] = part
    else:     # CuPy, the guard: part by part, into a flat view
        flat_out, write_back = _flat(output)
        for lo, hi, part in sp.parts:
            flat_out[lo:hi] = part if sp.on_host else backend.from_host(part)
        write_back()


def _check_records(group, plan: BoardAllToAllPlan) -> None:
    """Every peer's record equals mine; else raise on every rank, having read
    the records and then acknowledged the posts."""
    for rec in plan.peer_records:
        if rec.tobytes() != plan.record:
            error = mismatch_error(group, plan.records)
            group.transport.board.ack(plan.peers)
            raise error


def _as_agreed(sp: SplitPlan) -> bool:
    """Did every peer post my record and the S (and fits) of the last agreed
    call with these splits, byte for byte? (peer, record, words, bytes agreed)"""
    if sp.seen is None or not (sp.everyone_fits or sp.rounds):
        return False
    record = sp.plan.record
    for rec, words, before in sp.expected:
        if rec.tobytes() != record or words.tobytes() != before:
            return False
    return True


def _agree(group, sp: SplitPlan) -> list | None:
    """Parse the posted counts: S, checked (raise on every rank, having
    acknowledged the posts, if S[i][j] differs between i and j), kept in
    ``sp`` with the parts it puts in the slots; returns the sources (or None)."""
    n, r = group.size, group.rank
    plan = sp.plan
    rows = [plan.counts[(r + i) % n].tolist() for i in range(n)]   # row i: rank r + i
    try:
        sends, sources = parse_counts(group, [row[:2 * n] + row[2 * n + PID:] for row in rows])
    except Exception:
        group.transport.board.ack(plan.peers)
        raise
    sp.agree(group, sends)
    return sources
