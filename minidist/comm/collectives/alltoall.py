"""All-to-all with uneven splits: rank i sends part j of its input to rank j.

With N ranks, rank i's input is cut along its first axis into N parts of
``input_split_sizes[j]`` rows; part j goes to rank j, which stores what it gets
from rank i at rows ``offset_i .. offset_i + output_split_sizes[i]`` of its output.
Written as a matrix S (S[i][j] = rows rank i sends to rank j), rank i's input
splits are row i of S and its output splits are column i:

    input_split_sizes  on rank i = S[i][0], S[i][1], ..., S[i][N-1]
    output_split_sizes on rank j = S[0][j], S[1][j], ..., S[N-1][j]

so the call is consistent only if S[i][j] as rank i says it equals S[i][j] as
rank j says it. A mixture-of-experts layer sends each token to the rank of its
expert (a split matrix that changes every step); Ulysses sends each head slice
to its rank (all splits equal). The backward of an all-to-all is the all-to-all
with S transposed: the gradient of what j received from i goes back from j to i.

Pairwise exchange, N-1 steps: in step s rank r sends part r+s and receives from
r-s, so every pair meets once and no rank is flooded by all the others at once.
Rank r sends its M bytes less the part it keeps: sum_{j != r} S[r][j] rows,
(N-1)/N * M when the splits are equal.

    T = (N-1) * alpha + (N-1)/N * M / beta        (equal splits, M = input bytes)

The same-call check travels with the split sizes (like small.py's all-reduce):
each rank's block is its call record followed by its row and column of S, the
Bruck all-gather of check.py gives every rank every block, and every rank then
checks the whole matrix, so all raise the same ``CollectiveMismatchError``
naming the pair that disagrees, before any data moves.

Single copy. Through shared memory each part is copied twice (into a slot and
out of it) and the part a rank keeps once: 3 copies of M/2 per rank at N = 2,
where an MPI that reads its peer's memory directly (MPICH's CMA) makes 2. So
when the transport allows it (cma.py: one machine, host arrays), each block of
the check also carries the rank's pid and the address of its input, and rank r
then reads part r of every other rank's input straight into its output, in one
copy (``single_copy_all_to_all``). A last exchange, a dissemination over
ceil(log2 N) rounds, tells every rank that all reads are over (so inputs may
change again) and whether all succeeded; if one failed, every rank redoes the
call with the pairwise exchange (the oracle, ``pairwise_all_to_all``), and the
rank whose read failed offers no address any more, so its later calls are
pairwise. Messages: ceil(log2 N) for the check and as many to finish, instead
of ceil(log2 N) + N - 1 (the check, then the pairwise steps). Only at
SINGLE_COPY_MIN_BYTES and more: below, copies cost less than messages. The
addresses travel with the check, so a group made with check=False is pairwise.

A call should cost little more than its messages and copies (at 1 MiB the
Python around them was a third of the time), so what depends only on the
group, dtype and row shape is made once and kept in a plan (``AllToAllPlan``,
like small.py's): the line, the check's table and its views, the buffers of
``reads_done``. The table a call receives is parsed only when it differs from
the one parsed last, byte for byte; a step of training repeats its matrices.
"""
from __future__ import annotations

import os
from typing import Any

from minidist.comm.collectives.check import (CheckTable, agree, cached_plan, describe,
                                             one_byte_flags)
from minidist.comm.errors import CollectiveMismatchError
from minidist.comm.transport import cma

COUNT_BYTES = 8  # each split size travels as an int64, and so do the pid and the address
SINGLE_COPY_MIN_BYTES = 1 << 18  # a smaller all-to-all (per rank, on average): pairwise
_offered = {"single_copy": True}  # False once a read of a peer failed: offer no address


def split_sizes(sizes: list[int] | None, rows: int, n: int, what: str) -> list[int]:
    """The split sizes of one side, checked against its array's first axis."""
    if sizes is None:
        if rows % n:
            raise ValueError(f"all_to_all_single: {what} has {rows} rows, which do not split "
                             f"into {n} equal parts; pass {what}_split_sizes")
        return [rows // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or min(sizes) < 0 or sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {what}_split_sizes must be {n} non-negative "
                         f"counts summing to the {rows} rows of {what}, got {sizes}")
    return sizes


def offsets(sizes: list[int]) -> list[int]:
    """Starting row of each part: [0, s0, s0+s1, ...] (N+1 entries)."""
    edges = [0]
    for s in sizes:
        edges.append(edges[-1] + s)
    return edges


def source_of(group, flat_in: Any, flat_out: Any) -> tuple[int, int]:
    """(pid, address of ``flat_in``) for peers to read from, or (0, 0) when they
    cannot (no single-copy transport, a device array, input and output overlap)."""
    if not (group.transport.single_copy and _offered["single_copy"]):
        return 0, 0
    address, out = cma.host_address(flat_in), cma.host_address(flat_out)
    if address is None or out is None or (address < out + flat_out.nbytes
                                          and out < address + flat_in.nbytes):
        return 0, 0  # not in host memory, or input and output overlap
    return os.getpid(), address


class AllToAllPlan:
    """What an all-to-all of one (dtype, row shape) on one group needs, made once
    (like small.py's plans): the call's line and fields, the table of the check
    (one row per rank: record, row and column of S, pid and address) with its
    views and rounds, and the one-byte buffers of the "reads done" round. A call
    fills in its row, exchanges, and parses the table only when it differs from
    the last one (a training step repeats its split matrices and buffers)."""

    def __init__(self, group, dtype: Any, row_shape: tuple):
        n = group.size
        self.fields = dict(dtype=dtype.name, row_shape=row_shape)
        self.line = describe("all_to_all_single", **self.fields)
        self.check = CheckTable(group, self.line, (2 * n + 2) * COUNT_BYTES)
        self.counts = self.check.payload.view("int64")         # (N, 2N + 2) per row
        self.done = one_byte_flags()
        self.seen: bytes = b""                                 # the last table parsed
        self.parsed: tuple = ()                                # ... and what it said


def alltoall_plan(group, dtype: Any, row_shape: tuple) -> AllToAllPlan:
    """The plan for all-to-alls of ``dtype`` rows of ``row_shape`` on ``group``."""
    return cached_plan(group, ("all_to_all_single", dtype, row_shape), AllToAllPlan,
                       group, dtype, row_shape)


def check_splits(group, plan: AllToAllPlan, input_splits: list[int], output_splits: list[int],
                 tag: int, source: tuple[int, int] = (0, 0)
                 ) -> tuple[list[list[int]], list[tuple[int, int]] | None]:
    """The same-call check with the split sizes: raise on every rank unless every
    rank made the call ``plan.line`` and S[i][j] agrees between ranks i and j.
    Returns S (S[i][j]: rows i sends to j) and, when every rank offered its
    input (``source``: pid, address), each rank's (pid, address); else None."""
    plan.counts[0] = input_splits + output_splits + list(source)  # our row, column, address
    plan.check.gather(group, tag, "all_to_all_single check")      # raises on every rank
    seen = plan.counts.tobytes()
    if seen != plan.seen:
        plan.parsed = parse_counts(group, plan.counts.tolist())
        plan.seen = seen
    return plan.parsed


def parse_counts(group, counts: list[list[int]]
                 ) -> tuple[list[list[int]], list[tuple[int, int]] | None]:
    """S and the sources from the check's table (row i: rank r + i's row of S,
    column of S, pid, address); raise on every rank if S[i][j] as i says it
    differs from S[i][j] as j says it."""
    n, r = group.size, group.rank
    # Row i of the table is rank r + i: put the matrix in rank order.
    sends = [[0] * n for _ in range(n)]   # sends[i][j]: rows i says it sends to j
    recvs = [[0] * n for _ in range(n)]   # recvs[i][j]: rows j says it expects from i
    sources = [(0, 0)] * n
    for i in range(n):
        q = (r + i) % n
        row = counts[i]
        sends[q] = row[:n]
        for src in range(n):
            recvs[src][q] = row[n + src]
        sources[q] = (row[2 * n], row[2 * n + 1])
    wrong = [(i, j) for i in range(n) for j in range(n) if sends[i][j] != recvs[i][j]]
    if wrong:
        lines = [f"  rank {group.global_rank(i)} sends {sends[i][j]} rows to rank "
                 f"{group.global_rank(j)}, which expects {recvs[i][j]}" for i, j in wrong[:8]]
        raise CollectiveMismatchError(
            f"all_to_all_single on group {group.ranks}: split sizes do not agree (what rank "
            f"i sends to j, input_split_sizes[j] on i, must equal output_split_sizes[i] on "
            f"j):\n" + "\n".join(lines))
    return sends, (sources if all(pid for pid, _ in sources) else None)


def pairwise_all_to_all(group, flat_in: Any, in_edges: list[int], flat_out: Any,
                        out_edges: list[int], row: int, tag: int) -> None:
    """Move part j of ``flat_in`` (rows in_edges[j]..in_edges[j+1], ``row`` elements
    each) to rank j, receiving rank i's part into rows out_edges[i].. of ``flat_out``."""
    n, r = group.size, group.rank

    def part(flat, edges, j):
        return flat[edges[j] * row:edges[j + 1] * row]

    part(flat_out, out_edges, r)[...] = part(flat_in, in_edges, r)  # what I keep
    for s in range(1, n):
        dst, src = (r + s) % n, (r - s) % n
        group.sendrecv(part(flat_in, in_edges, dst), dst, part(flat_out, out_edges, src), src,
                       tag, what=f"all_to_all_single step {s}")


def worth_single_copy(sends: list[list[int]], row_bytes: int) -> bool:
    """Read directly only when ranks move at least SINGLE_COPY_MIN_BYTES each on
    average: below that the copies cost less than the messages, and the
    pairwise exchange's short way is as fast. Decided from S, so the same on
    every rank."""
    return sum(map(sum, sends)) * row_bytes >= len(sends) * SINGLE_COPY_MIN_BYTES


def single_copy_all_to_all(group, flat_in: Any, in_edges: list[int], flat_out: Any,
                           out_edges: list[int], row: int, sends: list[list[int]],
                           sources: list[tuple[int, int]], tag: int,
                           done: tuple | None = None) -> bool:
    """Rank r reads part r of every other rank's input (rank i's, at ``sources[i]``,
    rows offsets(S[i])[r].. of it) into its output, in one copy each (cma.py),
    in the order of the pairwise exchange (from r-1, r-2, ...) so that no two
    ranks read the same peer at once. Then ``reads_done``. False, on every
    rank, if some read failed: nothing moved for sure, take the pairwise way."""
    n, r = group.size, group.rank
    step = row * flat_in.itemsize  # bytes per row
    flat_out[out_edges[r] * row:out_edges[r + 1] * row] = \
        flat_in[in_edges[r] * row:in_edges[r + 1] * row]        # what I keep
    ok = True
    for s in range(1, n):
        src = (r - s) % n
        pid, address = sources[src]
        start = sum(sends[src][:r]) * step                     # part r of rank src's input
        ok = ok and cma.read(pid, address + start,
                             flat_out[out_edges[src] * row:out_edges[src + 1] * row])
    if not ok:
        _offered["single_copy"] = False  # this process cannot read its peers: stop trying
    if not reads_done(group, ok, tag, done):
        return False
    stats = group.stats.counted   # counted as it moved (stats.py)
    stats.bytes_sent += (in_edges[n] - (in_edges[r + 1] - in_edges[r])) * step
    stats.bytes_recv += (out_edges[n] - (out_edges[r + 1] - out_edges[r])) * step
    stats.msgs_sent += n - 1
    stats.msgs_recv += n - 1
    return True


def reads_done(group, ok: bool, tag: int, done: tuple | None = None) -> bool:
    """Every read of every rank's input is over, and whether all succeeded: the
    same answer on every rank (check.agree). ``done``: a plan's two buffers."""
    return agree(group, ok, tag, done or one_byte_flags(), "all_to_all_single reads done")
