"""All-to-all through the board: the split sizes and small inputs in one post.

alltoall.py's all-to-all starts with the same-call check, a Bruck all-gather of
every rank's record and row and column of the split matrix S, in ceil(log2 N)
rounds; then the parts move, pairwise (N-1 more steps) or by single-copy reads.
For small parts those rounds are the whole cost. On one machine every rank
posts instead, once, into its slot on the board (transport/board.py):

    slot of rank q = [record | S[q][:] (N) | S[:][q] (N) | pid, address, fits | input of q]

    post      the counts, and the input when it fits the slot (``fits``)
    wait      until every peer posted this call's ticket
    check     every record equals mine, S[i][j] as i says it = as j says it
    move      every input fits:  rank r copies part r of each rank's input out
                                 of its slot (offsets(S[q])[r] rows on), in rank order
              otherwise:         single-copy reads or the pairwise exchange
                                 (alltoall.py), with S and the addresses as posted
    ack       done with every slot

    T_board = alpha_post + sum_q S[q][r] * row / beta   (rank r, every input fitting)

Every rank sees every post, so every rank decides the same: the same way to
move the parts, the same ``CollectiveMismatchError`` when the splits disagree
(the pair is named, as alltoall.py names it). A peer that made another call
never posts; as with oneshot.py, the flight recorder shows it in this call
without a post, and the ranks join the records-only check, so all raise.
"""
from __future__ import annotations

import time
from typing import Any

from minidist import backend
from minidist.comm.collectives import oneshot
from minidist.comm.collectives.alltoall import offsets, parse_counts
from minidist.comm.collectives.check import cached_plan, describe, encode, mismatch_error
from minidist.comm.transport.base import host_view
from minidist.comm.transport.board import ticket_of
from minidist.trace import recorder as trace

FITS = 2   # index, after the 2N counts, of the pid (0), address (1), fits (2) words


def usable(group) -> bool:
    """Does ``group`` have a board to post on (one machine, the check on)?"""
    return oneshot.fits(group, 0) and group.check


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
        words = 2 * n + 3                                  # S row, S column, pid, address, fits
        head = -(-words * 8 // 64) * 64                    # the input starts on a cache line
        # Group rank q's slot: its counts (int64) and its input (bytes).
        self.counts = [board.data[q][:words * 8].view("int64") for q in group.ranks]
        self.inputs = [board.data[q][head:] for q in group.ranks]
        self.records = [board.records[q] for q in group.ranks]
        self.peer_records = [board.records[q] for q in self.peers]
        self.dtype = dtype
        self.room = board.capacity - head                  # input bytes a slot holds


def board_plan(group, dtype: Any, row_shape: tuple) -> BoardAllToAllPlan:
    return cached_plan(group, ("all_to_all_single board", dtype, row_shape), BoardAllToAllPlan,
                       group, dtype, row_shape)


def call(group, flat_out: Any, flat_in: Any, send: list[int], recv: list[int], row: int,
         source: tuple[int, int], plan: BoardAllToAllPlan, write_back, move) -> None:
    """``all_to_all_single`` through the board: number the call, run it, count it.
    ``move(group, flat_in, in_edges, flat_out, out_edges, row, S, sources, tag,
    None)`` moves the parts when some input is not on the board (api.py)."""
    tag = group.next_collective_tag()
    start = time.perf_counter()
    stats = group.stats
    before = stats.snapshot()
    board_all_to_all(group, flat_out, flat_in, send, recv, row, source, plan, group.calls, tag,
                     move)
    write_back()
    stats.record("all_to_all_single", before, plan.fields, time.perf_counter() - start)
    if trace.active is not None:
        trace.active.call("all_to_all_single", group.ranks, start, stats.last, group.group_desc)


def board_all_to_all(group, flat_out: Any, flat_in: Any, send: list[int], recv: list[int],
                     row: int, source: tuple[int, int], plan: BoardAllToAllPlan,
                     number: int, tag: int, move) -> None:
    """Move part j of ``flat_in`` to rank j (the module docstring)."""
    t = group.transport
    board = t.board
    n, r = group.size, group.rank
    ticket = ticket_of(group.ctx, number)
    t.board_claim(plan.line)
    fits = flat_in.nbytes <= plan.room
    plan.counts[r][:] = send + recv + [source[0], source[1], int(fits)]
    if fits:
        plan.inputs[r][:flat_in.nbytes] = backend.to_host(flat_in).view("uint8")
    if board.posted_record is not plan.record:
        board.records[plan.me][:] = host_view(plan.record)
        board.posted_record = plan.record
    t.board_post(ticket, flat_in.nbytes, 0, plan.peers)
    t.record_begin(group.ctx, number, group.ranks, plan.line)  # after the post (oneshot.py)
    strays = t.board_wait(plan.peers, ticket, plan.line)
    if strays:
        oneshot.another_way(group, plan, strays, tag)          # raises on every rank
    sends, sources, everyone_fits = _agreed(group, plan)       # raises on every rank
    in_edges, out_edges = offsets(send), offsets(recv)
    if everyone_fits:
        _copy_out(group, flat_out, out_edges, row, sends, plan)
        board.ack(plan.peers)
        _count(group, in_edges, out_edges, row * flat_in.itemsize)
    else:
        board.ack(plan.peers)    # S and the addresses are read: the slots may change
        move(group, flat_in, in_edges, flat_out, out_edges, row, sends, sources, tag, None)
    t.record_end()


def _agreed(group, plan: BoardAllToAllPlan) -> tuple[list, list | None, bool]:
    """S, the sources (or None) and whether every input is in its slot, from the
    posts; raise on every rank (having read the slots, then acknowledged them)
    if the records or the splits disagree."""
    n, r = group.size, group.rank
    board = group.transport.board
    for rec in plan.peer_records:
        if rec.tobytes() != plan.record:
            error = mismatch_error(group, plan.records)
            board.ack(plan.peers)
            raise error
    rows = [plan.counts[(r + i) % n].tolist() for i in range(n)]   # row i: rank r + i
    everyone_fits = all(row[2 * n + FITS] for row in rows)
    try:
        sends, sources = parse_counts(group, [row[:2 * n + 2] for row in rows])
    except Exception:
        board.ack(plan.peers)
        raise
    return sends, sources, everyone_fits


def _copy_out(group, flat_out: Any, out_edges: list[int], row: int, sends: list[list[int]],
              plan: BoardAllToAllPlan) -> None:
    """Rows out_edges[q].. of ``flat_out`` = part r of rank q's input, from its slot."""
    r = group.rank
    step = row * plan.dtype.itemsize                       # bytes per row
    for q in range(group.size):
        lo = sum(sends[q][:r]) * step
        part = plan.inputs[q][lo:lo + sends[q][r] * step].view(plan.dtype)
        flat_out[out_edges[q] * row:out_edges[q + 1] * row] = backend.from_host(part)


def _count(group, in_edges: list[int], out_edges: list[int], step: int) -> None:
    """Bytes of the parts for others (sent) and from others (received)."""
    n, r = group.size, group.rank
    stats = group.stats
    stats.bytes_sent += (in_edges[n] - (in_edges[r + 1] - in_edges[r])) * step
    stats.bytes_recv += (out_edges[n] - (out_edges[r + 1] - out_edges[r])) * step
    stats.msgs_sent += n - 1
    stats.msgs_recv += n - 1
