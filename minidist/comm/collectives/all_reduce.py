"""All-reduce, seven ways, and which one runs: every entry, ``choose`` and its thresholds.

Every rank starts with an array x_r and ends with op(x_0, ..., x_{N-1}), the
same bits on every rank. The algorithms differ in how many steps they take
(latency, alpha) and how many bytes cross each link (bandwidth, beta):

    naive   reduce to rank 0, which sends the result to everyone (here):
            T = 2(N-1) * (alpha + M/beta); rank 0 sends (N-1) * M bytes
    tree    binomial reduce, then binomial broadcast (here, on tree.py):
            T = 2 ceil(log2 N) * (alpha + M/beta)
    recursive_doubling
            log2 N exchanges of the whole array (tree.py):
            T = log2(N) * (alpha + M/beta)      -- best for small M
    ring    reduce-scatter then all-gather (here, on ring.py):
            T = 2(N-1) * alpha + 2(N-1)/N * M/beta  -- best for large M
    allgather
            every rank gathers all N arrays and folds them in rank order,
            in the same messages as the same-call check (small.py):
            T = ceil(log2 N) * alpha + (N-1) * M/beta  -- best for tiny M
            On one machine, where the array fits a slot of the board, the
            gather is one post read in place by every peer (oneshot.py):
            T = alpha_board + (N-1) * M/beta_read      -- the latency path
    hierarchical
            ring inside each node, ring between nodes on 1/L of the array, ring
            inside again (hierarchical.py): 2(K-1)/K * M/L per rank between
            nodes -- for K nodes of L ranks with slow links between them
    direct  each rank reads its chunk of every peer's array and folds it, then
            reads every other chunk from its owner (direct.py; one machine):
            T = 3 ceil(log2 N) * alpha + 2(N-1)/N * M/beta, each byte copied once

The alpha of each, measured here (bench/bench_latency.py: an all-reduce of 64
bytes on the 2-core VM, load average 0.2, best of 5 windows; world 4 is two
ranks per core; docs/collectives.md, "The latency path"), in microseconds:

    world   allgather:board   allgather:channels   rec.doubling   tree   ring   naive   direct
      2           5.7               10.7               20.5        28.5   29.2   27.1    38.6
      4          26.8               49.4              124.1       145.2  218.3  142.8   250.2

``naive`` is the oracle the others are tested against. ``choose`` names the
algorithm: the one asked for, or for ``auto`` one by size, as NCCL and MPI
libraries switch (the thresholds below, each with the run that set it).
``runnable`` then asks whether it can run on this group: ``direct`` needs
ranks that can read each other's memory (direct.py says how that is learned);
where they cannot, ``auto`` takes the ring and an explicit ``direct`` raises
naming why. ``run`` calls the entry. The cost model of each is in cost.py; the
demo demos/03_ring_allreduce.py prints the ring's bytes next to 2(N-1)/N * M.
"""
from __future__ import annotations

import json
import os
from typing import Any

from minidist.comm.collectives import direct, small
from minidist.comm.collectives.hierarchical import hierarchical_all_reduce
from minidist.comm.collectives.ring import chunk_bounds, ring_all_gather, ring_reduce_scatter
from minidist.comm.collectives.tree import (binomial_broadcast, binomial_reduce,
                                            recursive_doubling_all_reduce)
from minidist.comm.transport.reduce_op import ReduceOp, finish

ALGORITHMS = ("auto", "ring", "tree", "recursive_doubling", "naive", "allgather",
              "hierarchical", "direct")

# The thresholds of auto, from bench_collectives (float32, world 2 and 4 on the
# 2-core VM, microseconds per call, best of 5 windows; docs/collectives.md has the tables).
#
# allgather while the (N-1) * M bytes it sends are at most this. At world 2:
# 64 KiB took 18.9 us (recursive doubling 27.9, ring 36.0, MPICH 20.7), 128 KiB
# 29.5 (35.1, 42.3), 256 KiB 74.2 (51.6, 54.8); at world 4, 64 KiB took 105
# against 148 and 228, 128 KiB 316 against 198 and 251.
GATHER_BYTES = 192 * 1024
# recursive doubling below this, the ring from here: at 64/128 KiB recursive
# doubling took 27.5/36.0 us against the ring's 36.6/43.4 at world 2, 156/219
# against 275/298 at world 4; the ring won from 256-512 KiB (54.8 against 51.6
# at 256 KiB world 2 is level; 305 against 358 at world 4).
SMALL_BYTES = 256 * 1024
# direct from this size, the ring below: direct/MPICH busbw 1.06x/1.38x/2.50x at
# 4/16/64 MiB world 2 against the ring's 0.87x/0.91x/2.09x, and 1.04x/1.47x/2.02x
# against 0.85x/1.11x/1.50x at world 4; at 1 MiB direct took 244.5 us against the
# ring's 158.7 (pinning a peer's pages costs about 60 us per 512 KiB).
DIRECT_BYTES = 4 * 1024 * 1024

# `minidist bench collectives --tune` (bench/bench_collectives.py) measures every
# algorithm on this machine and writes the thresholds that keep auto nearest the
# fastest into a JSON file; a world started with MINIDIST_ALL_REDUCE_TUNING=<file>
# uses them (every rank reads the same file: a rank that chose otherwise would be
# caught by the same-call check, which compares the algorithm).
TUNING_ENV = "MINIDIST_ALL_REDUCE_TUNING"
TUNED = ("GATHER_BYTES", "SMALL_BYTES", "DIRECT_BYTES")


def load_tuning(path: str) -> dict:
    """Set auto's thresholds from a file written by ``--tune``; returns them."""
    with open(path) as f:
        tuned = json.load(f)
    unknown = set(tuned) - set(TUNED) - {"run"}
    if unknown:
        raise ValueError(f"{path}: unknown thresholds {sorted(unknown)}; expected {TUNED}")
    for name in TUNED:
        if name in tuned:
            globals()[name] = int(tuned[name])
    return {name: globals()[name] for name in TUNED}


if os.environ.get(TUNING_ENV):
    load_tuning(os.environ[TUNING_ENV])


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


# The entries, flat (1-D contiguous, reduced in place), op, tag: the call's
# same-call check has run before them (check.py).
ENTRIES = {"naive": naive_all_reduce, "tree": tree_all_reduce,
           "recursive_doubling": recursive_doubling_all_reduce, "ring": ring_all_reduce,
           "hierarchical": hierarchical_all_reduce}
# The entries whose first messages are the same-call check: (make the plan,
# run with it). A plan, made once per (group, shape, dtype, op), holds the
# check's table, whose blocks also carry the data (small.py) or the address of
# each rank's array (direct.py).
PLANNED = {"allgather": (small.plan_for, small.allgather_all_reduce),
           "direct": (direct.direct_plan, direct.direct_all_reduce)}


def choose(algorithm: str, nbytes: int, group_size: int) -> str:
    """The algorithm asked for, or for ``auto`` the one for an array of ``nbytes``
    at ``group_size`` ranks (the thresholds above)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all_reduce algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if algorithm != "auto":
        return algorithm
    if nbytes * (group_size - 1) <= GATHER_BYTES:
        return "allgather"
    if nbytes < SMALL_BYTES:
        return "recursive_doubling"
    return "ring" if nbytes < DIRECT_BYTES else "direct"


def runnable(algorithm: str, nbytes: int, group) -> str:
    """``choose``'s algorithm where it can run on ``group``. ``direct`` needs ranks
    that read each other's memory: where they cannot, ``auto`` takes the ring
    and an explicit ``direct`` raises ValueError naming why."""
    name = choose(algorithm, nbytes, group.size)
    if name != "direct" or group.size == 1:
        return name
    why = direct.cannot_run(group)  # the first time, all ranks learn it together
    if why is None:
        return name
    if algorithm == "auto":
        return "ring"
    raise ValueError(f"all_reduce(algorithm='direct') cannot run on this group: {why}. "
                     f"algorithm='auto' takes the ring here")


def make_plan(group, algorithm: str, tensor: Any, op: ReduceOp):
    """The plan of an algorithm in PLANNED (kept per group), else None."""
    if algorithm not in PLANNED or group.size == 1:
        return None
    return PLANNED[algorithm][0](group, tensor, op)


def run(group, flat: Any, op: ReduceOp, algorithm: str, tag: int, plan=None) -> None:
    """Reduce the 1-D contiguous ``flat`` in place across ``group`` with
    ``algorithm`` (from ``runnable``), using ``plan`` (from ``make_plan``)."""
    if group.size == 1:
        finish(op, flat, 1)
    elif plan is not None:
        PLANNED[algorithm][1](group, flat, plan, tag)
    else:
        ENTRIES[algorithm](group, flat, op, tag)
