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
"""
from __future__ import annotations

from typing import Any

from minidist.comm.collectives.check import (bruck_rounds, encode, gather_rows, host_table,
                                             raise_mismatch)
from minidist.comm.errors import CollectiveMismatchError
from minidist.comm.transport.base import host_view

COUNT_BYTES = 8  # each split size travels as an int64


def offsets(sizes: list[int]) -> list[int]:
    """Starting row of each part: [0, s0, s0+s1, ...] (N+1 entries)."""
    edges = [0]
    for s in sizes:
        edges.append(edges[-1] + s)
    return edges


def check_splits(group, line: str, input_splits: list[int], output_splits: list[int],
                 tag: int) -> None:
    """The same-call check with the split sizes: raise on every rank unless every
    rank made the call ``line`` and S[i][j] agrees between ranks i and j."""
    n, r = group.size, group.rank
    record = encode(line)
    head = len(record)
    table = host_table(n, head + 2 * n * COUNT_BYTES)
    table[0, :head] = host_view(record)
    counts = table[:, head:].view("int64")                       # (N, 2N) per row
    counts[0, :n] = input_splits                                 # our row of S
    counts[0, n:] = output_splits                                # our column of S
    whole = gather_rows(group, bruck_rounds(group, table), tag, "all_to_all_single check")
    if not whole or table[:, :head].tobytes() != record * n:
        raise_mismatch(group, line, tag)                          # raises on every rank
    # Row i of the table is rank r + i: put the matrix in rank order.
    sends = [[0] * n for _ in range(n)]   # sends[i][j]: rows i says it sends to j
    recvs = [[0] * n for _ in range(n)]   # recvs[i][j]: rows j says it expects from i
    for i in range(n):
        q = (r + i) % n
        row = [int(c) for c in counts[i].tolist()]
        sends[q] = row[:n]
        for src in range(n):
            recvs[src][q] = row[n + src]
    wrong = [(i, j) for i in range(n) for j in range(n) if sends[i][j] != recvs[i][j]]
    if wrong:
        lines = [f"  rank {group.global_rank(i)} sends {sends[i][j]} rows to rank "
                 f"{group.global_rank(j)}, which expects {recvs[i][j]}" for i, j in wrong[:8]]
        raise CollectiveMismatchError(
            f"all_to_all_single on group {group.ranks}: split sizes do not agree (what rank "
            f"i sends to j, input_split_sizes[j] on i, must equal output_split_sizes[i] on "
            f"j):\n" + "\n".join(lines))


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
