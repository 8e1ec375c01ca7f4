"""All-to-all through the board in rounds: an input larger than a slot, a piece at a time.

alltoall_board.py moves an all-to-all in one post when every rank's input fits
its slot (1 MiB less the counts' cache line). A larger input used to leave the
board for the pairwise exchange or single-copy reads (alltoall.py). At 4 ranks
on 2 cores that costs 2.5 times the board's time: at 1 MiB per rank, 366 us
against 144 us for an input of 1000 KiB that fits (bench_alltoall's call, best
of 3 interleaved runs, load average about 2), because each of the N-1 steps of
either way is a meeting of two ranks that share a core with two others, where
a post on the board is read by every peer whenever it runs. So, as the
two-shot all-reduce does (twoshot.py), the input goes through the slot in
pieces, one round each:

    rank q's input (M_q bytes, flat) in P_q = ceil(M_q / room) pieces of
        size_q = ceil(M_q / P_q) bytes; piece k = bytes k * size_q .. of it
    round 0   the call's post (alltoall_board.py): counts, record, piece 0
    round k   claim, copy piece k into my slot, post round_ticket(ticket, k),
              wait for every peer's round k post
    every round, rank r copies out of slot q what of part r of rank q's
              input (rows offsets(S[q])[r] ..) lies in piece k, then acks
    rounds:   K = max_q P_q (a rank out of pieces posts an empty round)

    T_rounds = K * alpha_post + 2 M / beta_mem     (M copied in, M copied out)

Each rank can compute every size_q and K from S, agreed in round 0, so every
rank runs the same rounds. Where every rank's input fits, K = 1 and this is
the one-post path. A rank's own part goes from its input to its output in one
copy. The bytes are those of the pairwise exchange: equal on every rank and
to the reference.

Which way, by world size (STREAM_BYTES): the rounds up to that much input per
rank, measured on 2 cores against the other ways in the same run. At 2 ranks
each rank has a core and the channels' meeting is cheap: no rounds (0). A
round costs a post and a wait, tens of microseconds at 4 ranks on 2 cores, so
the rounds are taken only where a slot holds STREAM_MIN_SLOT bytes or more
(a world made with small slots moves its parts through the channels).

Failure is the board's: the records and S are checked after round 0 (a
mismatch raises on every rank before any later round), a peer that never
posts a round, or dies between rounds, is named by the board's wait within
the timeout, with the flight recorder's report.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives.call import _flat
from minidist.comm.collectives.twoshot import round_ticket

# The largest input per rank (bytes) that goes through the board in rounds, by
# world size; a world size not listed takes the entry of the largest one below.
STREAM_BYTES = {
    2: 0,                  # 2 ranks, a core each: single-copy reads or pairwise
    4: 4 * 1024 * 1024,    # 4 ranks on 2 cores: rounds (see the module docstring)
}
STREAM_MIN_SLOT = 256 * 1024   # rounds only through slots of at least this many bytes


def stream_bytes(group_size: int) -> int:
    """The largest input per rank that goes in rounds at ``group_size`` ranks."""
    below = [n for n in STREAM_BYTES if n <= group_size]
    return STREAM_BYTES[max(below) if below else min(STREAM_BYTES)]


def piece_size(total: int, room: int) -> int:
    """Elements per round of an input of ``total`` elements through a slot of
    ``room`` elements: the input in as few rounds as fit, cut evenly."""
    rounds = max(1, -(-total // room))
    return -(-total // rounds)


class Part(NamedTuple):
    """Part r of rank q's input, as it goes through q's slot to my output."""
    q: int        # the rank (group rank) whose input it is
    size: int     # elements per round of rank q (piece_size)
    lo: int       # first element of the part in rank q's flat input
    hi: int       # one past its last
    out: int      # where its first element goes in my flat output


class Rounds(NamedTuple):
    """How the parts of one agreed S go through the slots."""
    count: int          # rounds, K = the most pieces of any rank
    size: int           # my elements per round
    total: int          # my input's elements
    parts: list         # Parts from the peers, in rank order
    keep: tuple         # (lo, hi, out): my own part, from my input straight to my output


def plan_rounds(sends: list[list[int]], row: int, room: int, r: int,
                out_edges: list[int]) -> Rounds:
    """The rounds for S = ``sends`` (rows), ``row`` elements a row, slots of
    ``room`` elements, seen from group rank ``r``."""
    n = len(sends)
    totals = [sum(s) * row for s in sends]
    sizes = [piece_size(t, room) for t in totals]
    count = max(-(-t // s) if s else 1 for t, s in zip(totals, sizes))
    parts = []
    for q in range(n):
        lo = sum(sends[q][:r]) * row
        part = Part(q, sizes[q], lo, lo + sends[q][r] * row, out_edges[q] * row)
        if q == r:
            keep = (part.lo, part.hi, part.out)
        elif part.hi > part.lo:
            parts.append(part)
    return Rounds(count, sizes[r], totals[r], parts, keep)


def copy_in(slot: Any, flat_in: Any, size: int, total: int, k: int, numpy: bool) -> int:
    """Piece k of my input (``size`` elements a round) into my slot; its bytes."""
    lo = k * size
    hi = min(lo + size, total)
    if hi <= lo:
        return 0
    slot[:hi - lo] = flat_in[lo:hi] if numpy else backend.to_host(flat_in[lo:hi])
    return (hi - lo) * slot.itemsize


def copy_out(slots: list, flat_out: Any, parts: list, k: int, numpy: bool) -> None:
    """What of each peer's part for me lies in its piece k: out of its slot,
    into my output."""
    for part in parts:
        start = k * part.size                          # piece k of rank q's input
        lo, hi = max(part.lo, start), min(part.hi, start + part.size)
        if lo < hi:
            piece = slots[part.q][lo - start:hi - start]
            flat_out[part.out + lo - part.lo:part.out + hi - part.lo] = \
                piece if numpy else backend.from_host(piece)


def stream(group, rounds: Rounds, slots: list, flat_in: Any, flat_out: Any, ticket: int,
           line: str, peers: list[int], numpy: bool) -> None:
    """Round 0 posted and seen (alltoall_board.py): copy it out, then rounds
    1 .. K-1 (the module docstring). ``slots``: each group rank's slot data as
    an array of the dtype; ``peers``: the global ranks of the others."""
    t = group.transport
    lo, hi, out = rounds.keep
    flat_out[out:out + hi - lo] = flat_in[lo:hi]          # my own part, one copy
    mine = slots[group.rank]
    for k in range(rounds.count):
        if k > 0:
            t.board_claim(line)                           # my last piece has been read
            nbytes = copy_in(mine, flat_in, rounds.size, rounds.total, k, numpy)
            t.board_post(round_ticket(ticket, k), nbytes, 0, peers)
            t.board_wait(peers, round_ticket(ticket, k), line)
        copy_out(slots, flat_out, rounds.parts, k, numpy)
        t.board.ack(peers)                                # done with their pieces k


class RoundsWay:
    """The rounds on one BoardAllToAllPlan (alltoall_board.py): the slots as
    elements of its dtype, and whether an input goes in rounds at all."""

    def __init__(self, board, group_size: int, inputs: list, room: int, dtype: Any):
        self.room = room // dtype.itemsize                 # elements a slot holds
        self.slots = [x[:self.room * dtype.itemsize].view(dtype) for x in inputs]
        self.limit = stream_bytes(group_size) if board.capacity >= STREAM_MIN_SLOT else 0
        self.itemsize = dtype.itemsize
        self.numpy = backend.get_backend() == "numpy"

    def takes(self, nbytes: int) -> bool:
        """Does an input of ``nbytes`` go in rounds, if the peers' do too?"""
        return nbytes <= self.limit

    def rounds(self, sends: list[list[int]], row: int, r: int, out_edges: list[int],
               everyone_fits: bool) -> Rounds | None:
        """The rounds of the agreed S, the same on every rank, or None when every
        input fits one post, or some rank's is too large for rounds (the parts
        then move off the board)."""
        if everyone_fits or not all(self.takes(sum(s) * row * self.itemsize) for s in sends):
            return None
        return plan_rounds(sends, row, self.room, r, out_edges)

    def first_piece(self, r: int, input: Any) -> None:
        """Piece 0 of my input (group rank ``r``) into my slot, with the call's post."""
        flat_in = xp.ascontiguousarray(input).reshape(-1)
        copy_in(self.slots[r], flat_in, piece_size(flat_in.size, self.room), flat_in.size, 0,
                self.numpy)

    def finish(self, group, rounds: Rounds, input: Any, output: Any, ticket: int, line: str,
               peers: list[int]) -> None:
        """Round 0 seen: copy it out and run the other rounds, in any layout."""
        flat_in = xp.ascontiguousarray(input).reshape(-1)
        if xp.may_share_memory(flat_in, output):          # in place: read a copy
            flat_in = flat_in.copy()
        flat_out, write_back = _flat(output)
        stream(group, rounds, self.slots, flat_in, flat_out, ticket, line, peers, self.numpy)
        write_back()
