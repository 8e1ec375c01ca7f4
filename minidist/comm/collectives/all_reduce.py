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
      2 *         5.0               10.1               19.5        27.8   27.8   26.4    36.7

    * after the latency path's cuts (oneshot.py: the fold written out, the
      stats counted from the plan; api.py: a kept plan goes straight to it),
      load average 6-9 from other work on the VM.

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

# The thresholds of auto, from `bench_collectives.py --tune --worlds 2 4 --repeats 2`
# on the 2-core VM (float32, microseconds per call, best of 5 windows; world 4 is
# two ranks per core; docs/collectives.md has the tables). Two runs ten minutes
# apart at load average 0.2-1.7 ("run 2", "run 3"); set it for your machine with
# --tune and MINIDIST_ALL_REDUCE_TUNING.
#
# allgather while the (N-1) * M bytes it sends are at most this: through the
# board (oneshot.py) up to 64 KiB it took 5.7-15.8 us at world 2 (recursive
# doubling 20.7-55.9, ring 29.6-63.3) and 28-53 us at world 4 (136-227); 128 KiB
# 51.6 at world 2 (rec. doubling 89.4) and, gathered through the channels, 233
# at world 4 (313): both runs fit 192 KiB.
GATHER_BYTES = 192 * 1024
# recursive doubling below this, the ring (or direct) from here: at 256 KiB it
# took 72 us against the ring's 157 at world 2 and 466 against 461 at world 4
# (run 3), 148 against 147 and 246 against 294 (run 2); at 512 KiB the ring or
# direct won in both.
SMALL_BYTES = 512 * 1024
# direct from this size, the ring below. The runs disagree: run 3 had direct
# 2-3x ahead of the ring from 512 KiB at world 2 but 1.15-1.34x behind it from
# 512 KiB to 8 MiB at world 4; run 2 had the ring ahead up to 16 MiB at both.
# Both had direct ahead from 32-64 MiB (8.7 against 13.4 ms, 23 against 59 ms at
# 64 MiB, run 3). 4 MiB keeps each run's worst ratio at 2.7-3.5x where 512 KiB
# or 16 MiB costs one run 3.4-3.5x; see docs/collectives.md.
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
