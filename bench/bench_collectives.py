"""All-reduce bandwidth: minidist's auto, ring, direct and naive vs MPICH, in one run.

    python bench/bench_collectives.py                 # worlds 2 and 4, 1 KiB .. 256 MiB
    python bench/bench_collectives.py --max-size 16M --worlds 2
    python bench/bench_collectives.py --collective all_to_all   # bench_alltoall.py

For every message size and world size it prints the time of one all-reduce of
float32 data, its algorithm bandwidth algbw = M / t, and the bus bandwidth
busbw = algbw * 2(N-1)/N (the nccl-tests convention: what each link carries,
comparable across N), for

- minidist ``auto`` (what ``all_reduce`` takes by default; the last column says
  which algorithm that is at each size), ``ring``, ``direct`` (each rank reads
  its peers' arrays in one copy, comm/collectives/direct.py) and ``naive`` on the local shared-memory
  transport (``minidist.launch`` world, default options: the same-call check
  included);
- mpi4py's native ``Allreduce`` (in place) under MPICH's ``mpiexec``: the
  reference, run as a subprocess of this script;
- a single-process ``memcpy`` of M bytes: a ceiling for any transfer on this
  machine (a ring step copies M/N bytes and adds M/N bytes per rank).

Each configuration is measured ``--repeats`` times, alternating minidist and
MPICH so that a burst of other load on the machine hits both; the best time of
the repeats is reported, each run's time being its best of 5 timed windows (3
above 16 MiB), on both sides alike. The ratio columns are minidist auto's,
ring's and direct's busbw over MPICH's.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from minidist.calc.comm import BUS_FACTORS
from minidist.comm.collectives.all_reduce import choose
from _args import byte_size, positive_int
from _collective_bench import (SIZES, best_of, human, iterations, row_cells, run_mpi,
                               slowest_rank, usable_cores, windows)

LATENCY_SIZE = 1 << 10


# -- minidist, on every rank of a World ---------------------------------------------

def minidist_sweep(sizes: list[int], algorithms: list[str]) -> dict:
    import minidist.distributed as dist
    from minidist.backend import synchronize, xp
    out = {}
    for alg in algorithms:
        for size in sizes:
            x = xp.zeros(size // 4, dtype="float32")
            iters = iterations(size)
            for _ in range(2 if size < (64 << 20) else 1):  # warm up
                dist.all_reduce(x, algorithm=alg)
            times = []
            for _ in range(windows(size)):
                dist.barrier()
                t = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(x, algorithm=alg)
                synchronize()  # a GPU backend's copies are asynchronous
                times.append((time.perf_counter() - t) / iters)
            out[f"{alg}:{size}"] = times
    return out


def run_minidist(n: int, sizes: list[int]) -> dict:
    from minidist.comm import World
    out = {}
    with World(n) as world:
        out.update(slowest_rank(world.run(minidist_sweep, sizes,
                                          ["auto", "ring", "direct", "naive"])))
        if LATENCY_SIZE not in sizes:
            out.update(slowest_rank(world.run(minidist_sweep, [LATENCY_SIZE], ["auto"])))
    with World(n, check=False) as world:  # what the same-call check costs
        out.update(slowest_rank(world.run(minidist_sweep, [LATENCY_SIZE], ["auto"]), "nocheck:"))
    return out


# -- MPICH, under mpiexec ------------------------------------------------------------

def mpi_worker(sizes: list[int]) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    out = {}
    for size in sizes:
        x = np.zeros(size // 4, dtype=np.float32)
        iters = iterations(size)
        for _ in range(2 if size < (64 << 20) else 1):
            comm.Allreduce(MPI.IN_PLACE, x)
        best = float("inf")
        for _ in range(windows(size)):
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(iters):
                comm.Allreduce(MPI.IN_PLACE, x)
            slowest = comm.allreduce((time.perf_counter() - t) / iters, op=MPI.MAX)
            best = min(best, slowest)
        out[f"mpi:{size}"] = best
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def memcpy_ceiling(sizes: list[int]) -> dict:
    out = {}
    for size in sizes:
        src = np.ones(size, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        iters = iterations(size)
        t = time.perf_counter()
        for _ in range(iters):
            np.copyto(dst, src)
        out[f"memcpy:{size}"] = (time.perf_counter() - t) / iters
    return out


# -- the table ---------------------------------------------------------------------------

def table(n: int, sizes: list[int], best: dict) -> str:
    factor = BUS_FACTORS["all_reduce"](n)
    sides = (("auto", "minidist auto"), ("ring", "minidist ring"), ("direct", "minidist direct"),
             ("naive", "minidist naive"), ("mpi", "MPICH Allreduce"))
    head = (f"{'size':>8} | " + " | ".join(f"{title:^26}" for _, title in sides)
            + f" | {'memcpy':>7} | {'auto/MPICH':>10} | {'ring/MPICH':>10} | {'direct/MPICH':>12}"
            + " | auto takes")
    sub = (f"{'':>8} | " + " | ".join([f"{'time':>9} {'algbw':>7} {'busbw':>8}"] * len(sides))
           + f" | {'GB/s':>7} | {'busbw':>10} | {'busbw':>10} | {'busbw':>12} |")
    lines = [f"world {n}  (busbw = algbw * 2(N-1)/N = algbw * {factor:.2f}; GB/s = 1e9 B/s)"]
    cores = usable_cores()
    if n > cores:
        lines.append(f"{n} ranks on {cores} core{'s' * (cores > 1)}: ranks share the cores "
                     f"and take turns (both minidist and MPICH)")
    lines += [head, sub, "-" * len(head)]
    for size in sizes:
        cells, busbws = row_cells(best, size, n, [key for key, _ in sides], "all_reduce")
        mc = best.get(f"memcpy:{size}")
        ratios = [f"{busbws[k] / busbws['mpi']:{w - 1}.2f}x" if "mpi" in busbws and k in busbws
                  else f"{'-':>{w}}" for k, w in (("auto", 10), ("ring", 10), ("direct", 12))]
        lines.append(f"{human(size):>8} | " + " | ".join(cells)
                     + f" | {size / mc / 1e9 if mc else 0:7.2f} | " + " | ".join(ratios)
                     + f" | {choose('auto', size, n)}")
    key = f"auto:{LATENCY_SIZE}"
    if key in best and f"mpi:{LATENCY_SIZE}" in best:
        mpi = best[f"mpi:{LATENCY_SIZE}"]
        auto, bare = best[key], best.get("nocheck:" + key, float("nan"))
        lines.append(f"{human(LATENCY_SIZE)} latency: minidist auto (allgather, the same-call "
                     f"check in its messages) {auto * 1e6:.1f}us = {auto / mpi:.2f}x MPICH's "
                     f"{mpi * 1e6:.1f}us; with the check off {bare * 1e6:.1f}us = "
                     f"{bare / mpi:.2f}x")
    return "\n".join(lines)


COLLECTIVES = ("all_reduce", "all_to_all")


def main() -> None:
    which = argparse.ArgumentParser(add_help=False)  # all_to_all: bench_alltoall.py, with the rest
    which.add_argument("--collective", choices=COLLECTIVES, default="all_reduce")
    known, rest = which.parse_known_args()
    if known.collective == "all_to_all":
        import bench_alltoall
        bench_alltoall.main(rest)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=positive_int, nargs="+", default=[2, 4])
    p.add_argument("--min-size", type=byte_size, default=1 << 10)
    p.add_argument("--max-size", type=byte_size, default=256 << 20)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--no-mpi", action="store_true", help="skip the MPICH reference")
    p.add_argument("--collective", choices=COLLECTIVES, default="all_reduce",
                   help="all_to_all: run bench_alltoall.py (vs MPI_Alltoallv) with the other flags")
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mpi_worker:
        mpi_worker([int(s) for s in args.sizes.split(",")])
        return
    sizes = [s for s in SIZES if args.min_size <= s <= args.max_size]
    if not sizes:
        p.error(f"no size between --min-size {args.min_size} and --max-size {args.max_size}: "
                "the sizes are 1K, 4K, 16K, ... 256M (powers of 4)")
    cores = usable_cores()
    print(f"all-reduce of float32, {cores} CPU core{'s' * (cores > 1)}, "
          f"best of {args.repeats} repeats")
    ceiling = memcpy_ceiling(sizes)
    for n in args.worlds:
        sweeps = [lambda: run_minidist(n, sizes)] + ([] if args.no_mpi else
                                                     [lambda: run_mpi(n, sizes, __file__)])
        best = best_of(sweeps, args.repeats, dict(ceiling))
        print()
        print(table(n, sizes, best), flush=True)


if __name__ == "__main__":
    main()
