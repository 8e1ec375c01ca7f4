"""All-reduce, eight ways, and which one runs: every entry, ``choose`` and its thresholds.

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
    twoshot every rank posts its array on the board, folds its chunk of all N
            posts, flags it, and copies the other chunks out (twoshot.py; one
            machine): T = 2 alpha_board * ceil(M/C) + (2 + 2(N-1)/N) * M/beta_mem,
            about half the one-shot's memory traffic (C: a slot, 1 MiB)

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

    twoshot, 64 bytes (its two flags), beside allgather:board in the same run
    (bench_collectives' minidist sweep, load average 5.7 from other work:
    indicative): 10.7 against 5.8 us at world 2, 240 against 130 at world 4;
    about two one-shot posts.

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
from typing import Any, NamedTuple

from minidist.comm.collectives import direct, small, twoshot
from minidist.comm.collectives.hierarchical import hierarchical_all_reduce
from minidist.comm.collectives.ring import chunk_bounds, ring_all_gather, ring_reduce_scatter
from minidist.comm.collectives.tree import (binomial_broadcast, binomial_reduce,
                                            recursive_doubling_all_reduce)
from minidist.comm.transport.reduce_op import ReduceOp, finish

ALGORITHMS = ("auto", "ring", "tree", "recursive_doubling", "naive", "allgather",
              "hierarchical", "direct", "twoshot")


class Thresholds(NamedTuple):
    """Where ``auto`` switches, at one world size (bytes of the array, M)."""
    gather_bytes: int   # allgather while (N-1) * M <= this
    small_bytes: int    # recursive doubling below this
    direct_bytes: int   # the ring below this, direct from it
    twoshot_bytes: int = 0   # past allgather, two-shot below this (before the others)


# The thresholds of auto per world size: where the algorithms cross depends on
# N (and, above 1 MiB, on the load of the machine). From two runs on the 2-core
# VM, microseconds per call, best of 2-3 alternating repeats of 5 windows:
#
#   "tune": `bench_collectives.py --tune --worlds 2 4 --repeats 2` (2026-11-27
#   03:17, load average 6-7 from other work; the board holding 1 MiB per rank);
#   "quiet": `bench_collectives.py` at world 2 on the quiet VM (its all-reduce
#   table, docs/collectives.md, "The bars, in one run").
#
# world 2: allgather (through the board) while M <= 256 KiB: 145.6 against
#   recursive doubling's 152.2 at 256 KiB, 275.6 against 271.3 at 512 KiB (tune);
#   recursive doubling below 1 MiB: the ring's 521.6 against its 538.8 at 1 MiB
#   (tune), 96.5 against 99.9 (quiet); the ring from 1 MiB at every size up to
#   64 MiB: quiet, it beat direct by 5-53% at 1, 4, 16 and 64 MiB (96.5 us
#   against 142.1, 316.9 against 332.8, 1872 against 2858, 8747 against 9668;
#   the table before it in docs/collectives.md, 16-63%), while under load direct was 1.2-6x ahead from
#   4 MiB (tune: 1506 against 1735 us, 8180 against 48090 at 64 MiB). auto
#   follows the quiet machine; `--tune` refits it to yours.
# world 4 (two ranks per core): allgather while (N-1) * M <= 3 MiB (M <= 1 MiB:
#   266.9 against the ring's 314.3 at 256 KiB in the tune run; 399.5 against
#   461.5 at 1 MiB in `bench_collectives.py --worlds 4` on the quiet VM,
#   2026-11-27 04:15), never recursive doubling (behind the ring at every larger
#   size), the ring below 4 MiB and direct from 4 MiB (1730 against the ring's
#   1870 at 4 MiB, 3290 against 4528 at 8 MiB in the tune run; quiet, 1550
#   against 1544 at 4 MiB).
#   Then the two-shot (twoshot.py) took every size from 256 KiB to 32 MiB, in
#   `bench_collectives.py --worlds 4 --algorithms allgather twoshot ring direct`
#   and a sweep of the sizes between (2026-11-27 06:48, load average 4-5 from
#   other work: indicative), microseconds, allgather / twoshot / ring / direct:
#     64 KiB   72.7 /  102.0 /  428 /  461      128 KiB 103.6 /  118.2 / 504 /  536
#     256 KiB  138 /    116 /  302 /  328       (the sweep: 185 / 146 / 633 / 708)
#     512 KiB  293 /    205 /  892 / 1097       1 MiB    413 /    256 /  461 /  635
#     4 MiB      - /   1088 / 1744 / 1489
#     16 MiB     - /   5104 / 7652 / 8654       32 MiB     - /  14057 / 29215 / 15280
#     64 MiB     - /  56623 / 59358 / 29804
#   so: allgather while M <= 128 KiB, the two-shot from there. (The loaded run had
#   direct ahead at 64 MiB; the quiet `bench_collectives.py --worlds 4`, 2026-11-27
#   07:45, did not: two-shot 21.61 ms against direct's 23.65 at 64 MiB, 5.03 against
#   7.37 at 16 MiB, 1.19 against 1.61 at 4 MiB; so the two-shot takes every size
#   above the all-gather's, as auto follows the quiet machine.)
#   At world 3 (3 ranks on 2 cores, same load) the two-shot lost to the
#   all-gather at 256 KiB and 1 MiB (295 against 146, 623 against 383 us) and
#   won only at 16 MiB (8675 against the ring's 11108): world 3 keeps world 2's
#   thresholds until a quiet sweep says otherwise.
NEVER = 1 << 62   # a threshold no array reaches
THRESHOLDS = {
    2: Thresholds(gather_bytes=256 * 1024, small_bytes=1024 * 1024, direct_bytes=NEVER),
    4: Thresholds(gather_bytes=3 * 128 * 1024, small_bytes=0, direct_bytes=4 * 1024 * 1024,
                  twoshot_bytes=NEVER),
}

# `minidist bench collectives --tune` (bench/bench_collectives.py) measures every
# algorithm on this machine and writes, per world size, the thresholds that keep
# auto nearest the fastest into a JSON file; a world started with
# MINIDIST_ALL_REDUCE_TUNING=<file> uses them (every rank reads the same file: a
# rank that chose otherwise would be caught by the same-call check, which
# compares the algorithm).
TUNING_ENV = "MINIDIST_ALL_REDUCE_TUNING"
TUNED = ("GATHER_BYTES", "SMALL_BYTES", "DIRECT_BYTES", "TWOSHOT_BYTES")   # the names in the file


def thresholds(group_size: int) -> Thresholds:
    """auto's thresholds at ``group_size`` ranks: its entry in THRESHOLDS, or
    the entry of the largest world size below it."""
    below = [n for n in THRESHOLDS if n <= group_size]
    return THRESHOLDS[max(below) if below else min(THRESHOLDS)]


def load_tuning(path: str) -> dict:
    """Set auto's thresholds from a file written by ``--tune``:
    ``{"worlds": {"2": {"GATHER_BYTES": .., "SMALL_BYTES": .., "DIRECT_BYTES": ..},
    ...}, "run": ".."}``; returns THRESHOLDS."""
    with open(path) as f:
        tuned = json.load(f)
    unknown = set(tuned) - {"worlds", "run"}
    worlds = tuned.get("worlds", {})
    for world in worlds.values():
        unknown |= set(world) - set(TUNED)
    if unknown or not worlds:
        raise ValueError(f"{path}: unknown thresholds {sorted(unknown)}; expected "
                         f'{{"worlds": {{"<N>": {{{", ".join(TUNED)}}}}}, "run": ...}}')
    for n, world in worlds.items():
        old = THRESHOLDS.get(int(n), thresholds(int(n)))
        THRESHOLDS[int(n)] = Thresholds(*(int(world.get(name, value))
                                          for name, value in zip(TUNED, old)))
    return THRESHOLDS


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
    at ``group_size`` ranks (``thresholds(group_size)``)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all_reduce algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if algorithm != "auto":
        return algorithm
    at = thresholds(group_size)
    if nbytes * (group_size - 1) <= at.gather_bytes:
        return "allgather"
    if nbytes < at.twoshot_bytes:
        return "twoshot"
    if nbytes < at.small_bytes:
        return "recursive_doubling"
    return "ring" if nbytes < at.direct_bytes else "direct"


def runnable(algorithm: str, nbytes: int, group) -> str:
    """``choose``'s algorithm where it can run on ``group``. ``direct`` needs ranks
    that read each other's memory, ``twoshot`` the board: where they cannot,
    ``auto`` takes the ring and an explicit ``direct`` or ``twoshot`` raises
    ValueError naming why."""
    name = choose(algorithm, nbytes, group.size)
    if name not in ("direct", "twoshot") or group.size == 1:
        return name
    # direct: the first time, all ranks learn it together
    why = direct.cannot_run(group) if name == "direct" else twoshot.cannot_run(group)
    if why is None:
        return name
    if algorithm == "auto":
        return "ring"
    raise ValueError(f"all_reduce(algorithm={name!r}) cannot run on this group: {why}. "
                     f"algorithm='auto' takes the ring here")


def make_plan(group, algorithm: str, tensor: Any, op: ReduceOp):
    """The plan of an algorithm in PLANNED or of the two-shot (kept per group),
    else None."""
    if group.size == 1:
        return None
    if algorithm == "twoshot":   # its own call path, as the one-shot's (api.py)
        return twoshot.plan_for(group, tensor, op)
    if algorithm not in PLANNED:
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
