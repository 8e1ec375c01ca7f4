"""All-reduce, seven ways: naive, tree, recursive doubling, ring, all-gather, hierarchical,
direct.

Every rank starts with an array x_r and ends with op(x_0, ..., x_{N-1}), the
same bits on every rank. The algorithms differ in how many steps they take
(latency, alpha) and how many bytes cross each link (bandwidth, beta):

    naive   reduce to rank 0, which sends the result to everyone:
            T = 2(N-1) * (alpha + M/beta); rank 0 sends (N-1) * M bytes
    tree    binomial reduce, then binomial broadcast:
            T = 2 ceil(log2 N) * (alpha + M/beta)
    recursive_doubling
            log2 N exchanges of the whole array:
            T = log2(N) * (alpha + M/beta)      -- best for small M
    ring    reduce-scatter then all-gather:
            T = 2(N-1) * alpha + 2(N-1)/N * M/beta  -- best for large M
    allgather
            every rank gathers all N arrays and folds them in rank order,
            in the same messages as the same-call check (small.py):
            T = ceil(log2 N) * alpha + (N-1) * M/beta  -- best for tiny M
    hierarchical
            ring inside each node, ring between nodes on 1/L of the array, ring
            inside again (hierarchical.py): 2(K-1)/K * M/L per rank between
            nodes -- for K nodes of L ranks with slow links between them
    direct  each rank reads its chunk of every peer's array and folds it, then
            reads every other chunk from its owner (direct.py; one machine):
            T = 3 ceil(log2 N) * alpha + 2(N-1)/N * M/beta, each byte copied once

``naive`` is the oracle the others are tested against; ``auto`` picks
``allgather`` while the (N-1) * M bytes it sends stay within ``GATHER_BYTES``
(its rounds are the check's, so the check costs no extra message), recursive
doubling below ``SMALL_BYTES``, the ring up to ``DIRECT_BYTES``, and direct
from there (which is the ring wherever ranks cannot read each other: another
transport, device arrays), as NCCL and MPI libraries switch algorithms by size.
Below DIRECT_BYTES the ring is faster: its pieces flow while the direct
all-reduce still pays its three dissemination rounds; below SMALL_BYTES recursive
doubling is: log2 N messages of M instead of 2(N-1) of M/N (measured crossings,
docs/collectives.md). The cost model of each is in cost.py; the demo
demos/03_ring_allreduce.py prints the ring's bytes next to 2(N-1)/N * M.
"""
from __future__ import annotations

from typing import Any

from minidist.comm.transport.reduce_op import ReduceOp, finish
from minidist.comm.collectives.hierarchical import hierarchical_all_reduce
from minidist.comm.collectives.ring import chunk_bounds, ring_all_gather, ring_reduce_scatter
from minidist.comm.collectives.tree import (binomial_broadcast, binomial_reduce,
                                recursive_doubling_all_reduce)

ALGORITHMS = ("auto", "ring", "tree", "recursive_doubling", "naive", "allgather",
              "hierarchical", "direct")
GATHER_BYTES = 192 * 1024  # auto: allgather while (N-1) * M is at most this
SMALL_BYTES = 256 * 1024  # auto: recursive doubling below this, the ring from here
DIRECT_BYTES = 4 * 1024 * 1024  # auto: direct from here (bench_collectives, docs/collectives.md)


def naive_all_reduce(group, flat: Any, op: ReduceOp, tag: int) -> None:
    """Rank 0 receives every array in rank order, reduces, and sends the result back."""
    if group.rank == 0:
        for src in range(1, group.size):  # one at a time: a fixed order of additions
            group.wait([group.irecv(flat, src, tag, op=op)], "naive all-reduce (reduce)")
        finish(op, flat, group.size)
        group.wait([group.isend(flat, dst, tag) for dst in range(1, group.size)],
                   "naive all-reduce (broadcast)")
    else:
        group.wait([group.isend(flat, 0, tag)], "naive all-reduce (reduce)")
        group.wait([group.irecv(flat, 0, tag)], "naive all-reduce (broadcast)")


def tree_all_reduce(group, flat: Any, op: ReduceOp, tag: int) -> None:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast of its result."""
    if group.rank == 0:
        binomial_reduce(group, flat, op, 0, tag)
        finish(op, flat, group.size)
    else:
        # Interior ranks accumulate children's partial sums; do that in a copy so
        # the caller's array is only ever overwritten by the final result.
        binomial_reduce(group, flat.copy(), op, 0, tag)
    binomial_broadcast(group, flat, 0, tag)


def ring_all_reduce(group, flat: Any, op: ReduceOp, tag: int) -> None:
    """Ring reduce-scatter, finish own chunk (AVG), ring all-gather."""
    bounds = chunk_bounds(flat.size, group.size)
    ring_reduce_scatter(group, flat, bounds, op, tag)
    lo, hi = bounds[group.rank]
    finish(op, flat[lo:hi], group.size)
    ring_all_gather(group, flat, bounds, tag)


def choose(algorithm: str, nbytes: int, group_size: int) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all_reduce algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if algorithm != "auto":
        return algorithm
    if nbytes * (group_size - 1) <= GATHER_BYTES:
        return "allgather"
    if nbytes < SMALL_BYTES:
        return "recursive_doubling"
    return "ring" if nbytes < DIRECT_BYTES else "direct"


def all_reduce_flat(group, flat: Any, op: ReduceOp, algorithm: str, tag: int) -> None:
    """Reduce the 1-D contiguous ``flat`` in place across ``group`` with ``algorithm``
    (all but ``allgather``, which collectives.all_reduce runs with its plan, small.py)."""
    if group.size == 1:
        finish(op, flat, 1)
        return
    run = {"ring": ring_all_reduce, "tree": tree_all_reduce,
           "recursive_doubling": recursive_doubling_all_reduce,
           "naive": naive_all_reduce, "hierarchical": hierarchical_all_reduce}[algorithm]
    run(group, flat, op, tag)
