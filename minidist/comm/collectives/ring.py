"""Ring algorithms: reduce-scatter and all-gather, the two halves of ring all-reduce.

The N ranks form a ring; rank r sends only to r+1 and receives only from r-1.
A flat buffer of M bytes is cut into N chunks (sizes differ by at most one
element when N does not divide the count).

Reduce-scatter, N-1 steps: in step s rank r sends chunk (r-s-1) mod N to the
right and receives chunk (r-s-2) mod N from the left, adding it into its own
copy of that chunk as it arrives (the fused receive-and-reduce). After N-1 steps
rank r holds chunk r summed over all ranks.

All-gather, N-1 steps: in step s rank r sends chunk (r-s) mod N to the right and
receives chunk (r-s-1) mod N from the left, a plain copy.

Each step moves M/N bytes per rank, so each phase sends (N-1)/N * M bytes and
a ring all-reduce sends 2(N-1)/N * M per rank, whatever N:

    T_ring = 2(N-1) * alpha + 2(N-1)/N * M / beta

Every chunk's final value is computed on one rank and then copied around, so
all ranks end with the same bits.
"""
from __future__ import annotations

from typing import Any

from minidist.comm.transport.reduce_op import ReduceOp


def chunk_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``n`` contiguous chunks of near-equal size."""
    edges = [i * count // n for i in range(n + 1)]
    return list(zip(edges[:-1], edges[1:]))


def ring_reduce_scatter(group, flat: Any, bounds: list[tuple[int, int]], op: ReduceOp,
                        tag: int) -> None:
    """In place on ``flat``: afterwards chunk ``group.rank`` holds the reduction."""
    n, r = group.size, group.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send_lo, send_hi = bounds[(r - s - 1) % n]
        recv_lo, recv_hi = bounds[(r - s - 2) % n]
        # Send one chunk right while the left neighbour's copy of the next one
        # is added into ours as it arrives (the fused receive-and-reduce).
        group.sendrecv(flat[send_lo:send_hi], right, flat[recv_lo:recv_hi], left, tag, op=op,
                       what=f"ring reduce-scatter step {s}")


def ring_all_gather(group, flat: Any, bounds: list[tuple[int, int]], tag: int) -> None:
    """In place on ``flat``: chunk i (held by rank i) is copied to every rank."""
    n, r = group.size, group.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send_lo, send_hi = bounds[(r - s) % n]
        recv_lo, recv_hi = bounds[(r - s - 1) % n]
        group.sendrecv(flat[send_lo:send_hi], right, flat[recv_lo:recv_hi], left, tag,
                       what=f"ring all-gather step {s}")
