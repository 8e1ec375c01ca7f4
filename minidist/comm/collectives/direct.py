"""Direct all-reduce: every rank reads the parts it needs straight from its peers' arrays.

The ring (ring.py) moves every byte through shared memory: the sender copies a
piece into a slot, the receiver adds it (reduce-scatter) or copies it (all-gather)
out of the slot. For an array of M bytes each rank makes, at N ranks,

    ring:    copies into slots 2(N-1)/N M,  adds (N-1)/N M,  copies out (N-1)/N M

and pays Python for every slot-sized piece. When a rank can read its peers'
memory (cma.py: one machine, host arrays), the slots are not needed:

    1. reduce-scatter: rank r owns chunk r of the array (ring.py's chunk_bounds).
       It reads chunk r of every other rank's array, a piece at a time into a
       small buffer that stays in cache, and folds them in rank order,
           x[c_r] = op(x_0[c_r], x_1[c_r], ..., x_{N-1}[c_r])     (AVG: then / N)
       writing the result over its own chunk.
    2. "reduced": a dissemination round (ceil(log2 N) one-byte messages): every
       chunk is final, and no rank still reads the bytes that phase 3 overwrites.
    3. all-gather: rank r reads chunk q of rank q's array into its own, for q != r.
    4. "done": a second dissemination: nobody reads any more, so every rank may
       return and its caller change the array.

    direct:  reads 2(N-1)/N M (one copy each), adds (N-1)/N M, no slots
    T_direct = 3 ceil(log2 N) alpha + 2(N-1)/N M / beta

The same bytes leave each rank as in the ring (2(N-1)/N M, the bandwidth
optimum), but each is copied once instead of twice, in a few large reads. The
messages are the check's (which carries every rank's pid and address) and the
two rounds: 3 ceil(log2 N), instead of the ring's 2(N-1).

Every chunk is folded once, by its owner, left to right in rank order, then
copied: every rank gets the same bits, those of the naive all-reduce
(all_reduce.py), which folds in the same order.

Over an emulated link (link.py) a reader first waits, asleep and without the
GIL, for each piece's time on the wire from its peer (``Transport.read_peer``),
so a read of n bytes costs n / beta like a send: the comm thread leaves the core
to backward while the bytes are "on the wire", and copies them when they land.

Whether the ranks may read each other at all is learned once per group, by
``cannot_run``, before the first direct all-reduce is issued (all_reduce.py
asks it): a group made with ``check=False`` cannot (the addresses travel with
the check), nor a transport without peer reads (MPI), nor device arrays; and
where Yama's ptrace_scope or a container's seccomp filter forbids the reads,
the probe finds out: every rank offers a buffer's address in a same-call
check, reads one byte of every peer's, and all agree, by a dissemination
round, whether every read worked. A read that fails later (a peer gone) raises.
"""
from __future__ import annotations

import os
from functools import partial
from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives import work
from minidist.comm.collectives.check import (CheckTable, agree, cached_plan, describe,
                                             one_byte_flags)
from minidist.comm.collectives.ring import chunk_bounds
from minidist.comm.errors import CommError
from minidist.comm.transport import cma
from minidist.comm.transport.reduce_op import ReduceOp, combine_fn, finish

PIECE_BYTES = 512 * 1024  # read and folded at a time: a piece and its buffers stay in cache


class DirectPlan:
    """What a direct all-reduce of one (shape, dtype, op) on one group needs, made
    once (as small.py's plans): the call's line, the check's table (record, pid,
    address per rank) and its views, the chunks, the two piece buffers."""

    def __init__(self, group, shape: tuple, dtype: Any, op: ReduceOp):
        n = group.size
        self.fields = dict(op=op.name, algorithm="direct", dtype=dtype.name, shape=shape)
        self.line = describe("all_reduce", **self.fields)
        self.check = CheckTable(group, self.line, 16)        # row i: rank r + i
        self.sources = self.check.payload.view("int64")      # (N, 2): pid, address
        self.flags = one_byte_flags()                        # the two rounds
        count = 1
        for s in shape:
            count *= s
        self.bounds = chunk_bounds(count, n)                 # chunk q: owned by rank q
        self.op, self.combine = op, combine_fn(op)
        self.piece = max(1, PIECE_BYTES // dtype.itemsize)   # elements per piece
        self.acc = xp.empty(self.piece, dtype=dtype)         # the fold of a piece
        self.tmp = xp.empty(self.piece, dtype=dtype)         # a peer's piece


def direct_plan(group, tensor: Any, op: ReduceOp) -> DirectPlan:
    """The plan for a direct all-reduce of ``tensor`` with ``op``, made on first use."""
    return cached_plan(group, ("direct", tensor.shape, tensor.dtype, op), DirectPlan,
                       group, tensor.shape, tensor.dtype, op)


def cannot_run(group) -> str | None:
    """Why the ranks of ``group`` cannot read each other's arrays, or None when
    they can. The first time it gets that far, every rank of the group runs
    the probe (the module docstring), a collective of its own."""
    if not group.check:
        return ("the group was made with check=False, and the addresses of the arrays "
                "travel with the same-call check")
    if not group.transport.peer_reads:
        return (f"the {group.transport.name} transport cannot read its peers' "
                f"memory (the local transport can, on one machine)")
    if backend.get_backend() == "cupy":
        return "the arrays are in device memory, which another process cannot read"
    if group.direct_reads is None:
        work.submit(partial(_probe, group, group.next_collective_tag()), async_op=False)
    if not group.direct_reads:
        return ("a rank could not read its peers' memory at the group's first direct "
                "all-reduce (Yama's ptrace_scope or a container's seccomp filter forbids "
                "cross-memory reads)")
    return None


PROBE_LINE = "direct all-reduce probe: may ranks read each other's memory?"


def _probe(group, tag: int) -> None:
    """group.direct_reads = whether every rank read one byte of every peer's table."""
    n, r = group.size, group.rank
    check = CheckTable(group, PROBE_LINE, 16)
    sources = check.payload.view("int64")                    # (N, 2): pid, address
    sources[0] = offer(group, check.table)
    check.gather(group, tag, "direct all-reduce probe")      # raises on every rank
    rows = sources.tolist()
    peers = [rows[(q - r) % n] for q in range(n)]
    byte = xp.empty(1, dtype="uint8")
    ok = all(_read(group, peers, q, 0, byte, raising=False) for q in range(n) if q != r)
    group.direct_reads = agree(group, ok, tag, one_byte_flags(), "direct all-reduce probe")


def offer(group, arr: Any) -> tuple[int, int]:
    """(pid, address of the host array ``arr``) for the peers to read."""
    address = cma.host_address(arr)
    if address is None:
        raise CommError(f"rank {group.global_rank(group.rank)}: the direct all-reduce needs "
                        f"a C-contiguous host array")
    return os.getpid(), address


def direct_all_reduce(group, flat: Any, plan: DirectPlan, tag: int) -> None:
    """Reduce the 1-D contiguous ``flat`` in place (the module docstring), after
    the same-call check; on a group whose ranks can read each other (``cannot_run``)."""
    n, r = group.size, group.rank
    plan.sources[0] = offer(group, flat)
    plan.check.gather(group, tag, "direct all-reduce check")  # raises on every rank
    rows = plan.sources.tolist()
    peers = [rows[(q - r) % n] for q in range(n)]            # rank q's [pid, address]
    mine = _pieces(plan.bounds[r], plan.piece)               # 1. reduce-scatter
    arrivals = {q: _arrivals(group, q, mine, flat.itemsize) for q in range(n) if q != r}
    for i, (start, stop) in enumerate(mine):
        _fold_piece(group, flat, plan, peers, start, stop, {q: a[i] for q, a in arrivals.items()})
    agree(group, True, tag, plan.flags, "direct all-reduce reduced")  # 2. "reduced"
    order = [(r - s) % n for s in range(1, n)]               # not all reading rank 0 first
    theirs = {q: _pieces(plan.bounds[q], plan.piece) for q in order}
    arrivals = {q: _arrivals(group, q, theirs[q], flat.itemsize) for q in order}
    for q in order:                                          # 3. all-gather
        for (start, stop), arrival in zip(theirs[q], arrivals[q]):
            _read(group, peers, q, start, flat[start:stop], arrival)
    agree(group, True, tag, plan.flags, "direct all-reduce done")     # 4. "done"
    _count(group, flat, plan)


def _pieces(bounds: tuple[int, int], piece: int) -> list[tuple[int, int]]:
    """The chunk [lo, hi) cut into pieces of at most ``piece`` elements."""
    lo, hi = bounds
    return [(start, min(start + piece, hi)) for start in range(lo, hi, piece)]


def _arrivals(group, q: int, pieces: list, itemsize: int) -> list[int]:
    """When each piece read from rank q lands, all asked for now, back to back
    (an emulated link, link.py: the reader naps until then before reading
    it, and copies one piece while the next is on the wire); 0s without one."""
    return [group.transport.read_arrival(group.global_rank(q), (stop - start) * itemsize)
            for start, stop in pieces]


def _fold_piece(group, flat: Any, plan: DirectPlan, peers: list, start: int,
                stop: int, arrival: dict[int, int]) -> None:
    """flat[start:stop] = op(x_0, ..., x_{N-1}) on those elements, in rank order;
    rank q's piece is read once it has landed, at ``arrival[q]``."""
    n, r = group.size, group.rank
    mine = flat[start:stop]
    k = stop - start
    if r <= 1:
        # Ranks 0 and 1 fold into their own piece, no buffer: op is commutative,
        # so x_1 op x_0 has the bits of x_0 op x_1, and the rest follow in order.
        acc, rest = mine, [q for q in range(n) if q != r]
    else:
        acc, rest = plan.acc[:k], range(1, n)
        _read(group, peers, 0, start, acc, arrival[0])
    for q in rest:
        if q == r:
            operand = mine
        else:
            operand = plan.tmp[:k]
            _read(group, peers, q, start, operand, arrival[q])
        plan.combine(acc, operand, out=acc)
    finish(plan.op, acc, n)
    if acc is not mine:
        mine[...] = acc


def _read(group, peers: list, q: int, start: int, out: Any, arrival: int = 0,
          raising: bool = True) -> bool:
    """out[:] = rank q's array from element ``start`` on (one copy, cma.py), once
    landed at ``arrival``."""
    pid, address = peers[q]
    ok = group.transport.read_peer(group.global_rank(q), pid, address + start * out.itemsize,
                                   out, arrival)
    if not ok and raising:
        raise CommError(f"rank {group.global_rank(group.rank)}: the direct all-reduce could "
                        f"not read rank {group.global_rank(q)}'s array (has it exited?)")
    return ok


def _count(group, flat: Any, plan: DirectPlan) -> None:
    """Bytes that left and reached this rank: phase 1 the others' chunk of ours
    and ours of theirs, phase 2 the other way round; 2(N-1)/N M each for equal chunks."""
    n, r = group.size, group.rank
    lo, hi = plan.bounds[r]
    moved = ((flat.size - (hi - lo)) + (n - 1) * (hi - lo)) * flat.itemsize
    stats = group.stats.counted   # counted as it moved (stats.py)
    stats.bytes_sent += moved
    stats.bytes_recv += moved
    stats.msgs_sent += 2 * (n - 1)
    stats.msgs_recv += 2 * (n - 1)
