"""All-reduce and all-to-all: minidist vs MPICH and torch's gloo, in one run, and the bars.

    python bench/bench_collectives.py                 # world 2, 1 KiB .. 64 MiB, gloo too
    python bench/bench_collectives.py --worlds 4      # the same table at 4 ranks
    python bench/bench_collectives.py --max-size 16M --worlds 2 4 --peer none
    python bench/bench_collectives.py --collective all_to_all   # bench_alltoall.py alone
    python bench/bench_collectives.py --tune          # fit auto's thresholds (_tune.py)

For every message size and world size it prints the time of one all-reduce of
float32 data, and for ``auto`` and the references its algorithm bandwidth
algbw = M / t and bus bandwidth busbw = algbw * 2(N-1)/N (the nccl-tests
convention: what each link carries, comparable across N), for

- minidist ``auto`` (what ``all_reduce`` takes by default; the last column says
  which algorithm that is at each size) and each algorithm auto chooses from:
  ``allgather`` (through the board while the array fits a rank's slot,
  comm/collectives/oneshot.py; up to 1 MiB), ``recursive_doubling`` (up to 4 MiB),
  ``ring`` and ``direct`` (each rank reads its peers' arrays in one copy,
  comm/collectives/direct.py), on the local shared-memory transport
  (``minidist.launch`` world, default options: the same-call check included);
- mpi4py's native ``Allreduce`` (in place) under MPICH's ``mpiexec``: the
  reference, run as a subprocess of this script;
- torch.distributed's ``all_reduce`` on the gloo backend (the CPU backend a
  learner would otherwise use), N processes of its own: where torch is
  installed, unless ``--peer none``;
- a single-process ``memcpy`` of M bytes: a ceiling for any transfer on this
  machine (a ring step copies M/N bytes and adds M/N bytes per rank).

Each configuration is measured ``--repeats`` times, alternating minidist and
the references so that a burst of other load on the machine hits all; the best
time of the repeats is reported, each run's time being its best of 5 timed
windows (3 above 16 MiB), each window timed by its slowest rank, on every side
alike. auto's time is the better of its own column and that of the algorithm it
takes (the same calls, timed twice). ``auto/MPICH`` is auto's busbw over
MPICH's, ``auto/best`` auto's time over the fastest algorithm's at that size
(1.00 when auto took it), ``gloo/auto`` how many times faster auto is than gloo.

Then, at the same world size, bench_alltoall.py's table (all_to_all_single of
float32 in N equal parts against MPICH's Alltoallv and gloo's
all_to_all_single), and last the bars of _bars.py, each saying whether it
holds in this run: the 1 KiB all-reduce against MPICH's, auto's bus bandwidth
against MPICH's per size, auto against the fastest algorithm per size,
all-to-all against MPICH's per size, and minidist against gloo.

``--tune`` sweeps allgather, twoshot, recursive doubling, ring and direct over 1 KiB ..
64 MiB (powers of 2), fits the thresholds that keep auto nearest the fastest at every size
and world (_tune.py), prints them with the ratio they give at each point, and
writes them to ``--tune-file``, for a world started with
MINIDIST_ALL_REDUCE_TUNING=<that file> (all_reduce.py).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from minidist.calc.comm import BUS_FACTORS
from minidist.comm.collectives.all_reduce import TUNING_ENV, choose
from _args import byte_size, positive_int
import _bars
from _collective_bench import (SIZES, best_of, gloo_available, human, iterations, row_cells,
                               run_gloo, run_mpi, slowest_rank, usable_cores, windows)

LATENCY_SIZE = 1 << 10
ALGORITHMS = ("auto", "allgather", "twoshot", "recursive_doubling", "ring", "direct")
# The largest size each algorithm is timed at (None: every size): allgather sends
# (N-1) * M bytes and recursive doubling log2(N) * M, far behind beyond these.
LARGEST = {"allgather": 1 << 20, "recursive_doubling": 4 << 20}
TUNE_SIZES = [1 << k for k in range(10, 27)]   # 1 KiB, 2 KiB, ..., 64 MiB


# -- minidist, on every rank of a World ---------------------------------------------

def minidist_sweep(sizes: list[int], algorithms: list[str]) -> dict:
    import minidist.distributed as dist
    from minidist.backend import synchronize, xp
    out = {}
    for alg in algorithms:
        for size in sizes:
            if size > LARGEST.get(alg, size):
                continue
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


def run_minidist(n: int, sizes: list[int], algorithms=ALGORITHMS) -> dict:
    from minidist.comm import World
    out = {}
    with World(n) as world:
        out.update(slowest_rank(world.run(minidist_sweep, sizes, list(algorithms))))
        if LATENCY_SIZE not in sizes and "auto" in algorithms:
            out.update(slowest_rank(world.run(minidist_sweep, [LATENCY_SIZE], ["auto"])))
    if "auto" in algorithms:
        with World(n, check=False) as world:  # what the same-call check costs
            out.update(slowest_rank(world.run(minidist_sweep, [LATENCY_SIZE], ["auto"]),
                                    "nocheck:"))
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

def _time(t: float | None) -> str:
    if t is None:
        return f"{'-':>9}"
    return f"{t * 1e6:.1f}us" if t < 1e-2 else f"{t * 1e3:.2f}ms"


def table(n: int, sizes: list[int], best: dict, algorithms=ALGORITHMS) -> str:
    factor = BUS_FACTORS["all_reduce"](n)
    gloo = any(k.startswith("gloo:") for k in best)
    others = [a for a in algorithms if a != "auto"]
    short = {"recursive_doubling": "rec.doubl"}   # column titles of 9 characters
    head = (f"{'size':>8} | {'minidist auto':^26} | "
            + " | ".join(f"{short.get(a, a):>9}" for a in others)
            + f" | {'MPICH Allreduce':^26}" + (f" | {'gloo':>9}" if gloo else "")
            + f" | {'memcpy':>7} | {'auto/MPICH':>10} | {'auto/best':>9}"
            + (f" | {'gloo/auto':>9}" if gloo else "") + " | auto takes")
    sub = (f"{'':>8} | {'time':>9} {'algbw':>7} {'busbw':>8} | "
           + " | ".join(f"{'time':>9}" for _ in others)
           + f" | {'time':>9} {'algbw':>7} {'busbw':>8}" + (f" | {'time':>9}" if gloo else "")
           + f" | {'GB/s':>7} | {'busbw':>10} | {'time':>9}" + (f" | {'time':>9}" if gloo else "")
           + " |")
    lines = [f"world {n}  (busbw = algbw * 2(N-1)/N = algbw * {factor:.2f}; GB/s = 1e9 B/s)"]
    cores = usable_cores()
    if n > cores:
        lines.append(f"{n} ranks on {cores} core{'s' * (cores > 1)}: ranks share the cores "
                     f"and take turns (minidist, MPICH and gloo alike)")
    lines += [head, sub, "-" * len(head)]
    for size in sizes:
        # auto is its pick: its time is the better of the two measurements of it
        pick = best.get(f"{choose('auto', size, n)}:{size}", float("inf"))
        if f"auto:{size}" in best:
            best[f"auto:{size}"] = min(best[f"auto:{size}"], pick)
        cells, busbws = row_cells(best, size, n, ["auto", "mpi"], "all_reduce")
        auto = best.get(f"auto:{size}")
        measured = [best[f"{a}:{size}"] for a in algorithms if f"{a}:{size}" in best]
        mc = best.get(f"memcpy:{size}")
        row = (f"{human(size):>8} | {cells[0]} | "
               + " | ".join(f"{_time(best.get(f'{a}:{size}')):>9}" for a in others)
               + f" | {cells[1]}")
        if gloo:
            row += f" | {_time(best.get(f'gloo:{size}')):>9}"
        mpi_ratio = (f"{busbws['auto'] / busbws['mpi']:9.2f}x" if {"auto", "mpi"} <= set(busbws)
                     else f"{'-':>10}")
        row += f" | {size / mc / 1e9 if mc else 0:7.2f} | {mpi_ratio}"
        row += f" | {auto / min(measured):8.2f}x" if auto and measured else f" | {'-':>9}"
        if gloo:
            g = best.get(f"gloo:{size}")
            row += f" | {g / auto:8.1f}x" if g and auto else f" | {'-':>9}"
        lines.append(row + f" | {choose('auto', size, n)}")
    key = f"auto:{LATENCY_SIZE}"
    if key in best and f"mpi:{LATENCY_SIZE}" in best:
        mpi = best[f"mpi:{LATENCY_SIZE}"]
        auto, bare = best[key], best.get("nocheck:" + key, float("nan"))
        lines.append(f"{human(LATENCY_SIZE)} latency: minidist auto ({choose('auto', LATENCY_SIZE, n)}"
                     f", the same-call check in its messages) {auto * 1e6:.1f}us = "
                     f"{auto / mpi:.2f}x MPICH's {mpi * 1e6:.1f}us; with the check off "
                     f"{bare * 1e6:.1f}us = {bare / mpi:.2f}x")
    return "\n".join(lines)


# -- --tune: fit auto's thresholds to this machine ----------------------------------------

def tune(worlds: list[int], repeats: int, path: str) -> None:
    import _tune
    from minidist.comm.collectives import all_reduce
    algorithms = [a for a in ALGORITHMS if a != "auto"]
    times = {}
    for n in worlds:
        best = best_of([lambda: run_minidist(n, TUNE_SIZES, algorithms)], repeats)
        for key, t in best.items():
            alg, size = key.rsplit(":", 1)
            times[(n, alg, int(size))] = t
    fitted, ratios = _tune.fit(times)
    run = (f"bench_collectives --tune, worlds {worlds}, {usable_cores()} cores, "
           f"best of {repeats}, {time.strftime('%Y-%m-%d %H:%M')}")
    tuned = dict(worlds={str(n): dict(zip(all_reduce.TUNED, t)) for n, t in fitted.items()},
                 run=run)
    with open(path, "w") as f:
        json.dump(tuned, f, indent=1)
    now = {n: tuple(all_reduce.thresholds(n)) for n in fitted}
    before = _tune.ratios(times, now)
    print(f"{'world':>5} {'size':>8} | " + " ".join(f"{a:>18}" for a in algorithms)
          + " | tuned takes        auto/best | now takes          auto/best")
    for n, size in sorted(ratios):
        cells = " ".join(f"{_time(times.get((n, a, size))):>18}" for a in algorithms)
        print(f"{n:>5} {human(size):>8} | {cells} | {_tune.pick(n, size, *fitted[n]):<18}"
              f" {ratios[(n, size)]:8.2f}x | {_tune.pick(n, size, *now[n]):<18} "
              f"{before[(n, size)]:8.2f}x")
    for n, (gather, small, direct, twoshot) in fitted.items():
        print(f"tuned, world {n}: gather_bytes={gather} small_bytes={small} "
              f"direct_bytes={direct} twoshot_bytes={twoshot}")
    print(f"auto within {(max(ratios.values()) - 1) * 100:.1f}% of the fastest at every point "
          f"(the thresholds in all_reduce.py: {(max(before.values()) - 1) * 100:.1f}%)")
    print(f"written to {path}; use them with {TUNING_ENV}={path}")


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
    p.add_argument("--worlds", type=positive_int, nargs="+", default=[2],
                   help="world sizes (the 4-rank table: --worlds 4, or --worlds 2 4)")
    p.add_argument("--min-size", type=byte_size, default=1 << 10)
    p.add_argument("--max-size", type=byte_size, default=64 << 20)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--algorithms", nargs="+", choices=ALGORITHMS + ("naive", "tree"),
                   default=list(ALGORITHMS), help="minidist's columns (auto first)")
    p.add_argument("--no-mpi", action="store_true", help="skip the MPICH reference")
    p.add_argument("--no-all-to-all", action="store_true",
                   help="the all-reduce table only (no all-to-all table and bar)")
    p.add_argument("--peer", choices=("gloo", "none"), default="gloo",
                   help="torch.distributed's gloo beside minidist and MPICH (skipped "
                        "without torch); none: leave it out")
    p.add_argument("--tune", action="store_true",
                   help="fit auto's thresholds to this machine and write them to --tune-file")
    p.add_argument("--tune-file", default="all_reduce_tuning.json")
    p.add_argument("--collective", choices=COLLECTIVES, default="all_reduce",
                   help="all_to_all: run bench_alltoall.py (vs MPI_Alltoallv) with the other flags")
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mpi_worker:
        mpi_worker([int(s) for s in args.sizes.split(",")])
        return
    if args.tune:
        tune(args.worlds, args.repeats, args.tune_file)
        return
    sizes = [s for s in SIZES if args.min_size <= s <= args.max_size]
    if not sizes:
        p.error(f"no size between --min-size {args.min_size} and --max-size {args.max_size}: "
                "the sizes are 1K, 4K, 16K, ... 256M (powers of 4)")
    algorithms = ["auto"] + [a for a in args.algorithms if a != "auto"]
    cores = usable_cores()
    gloo = args.peer == "gloo"
    print(f"all-reduce and all-to-all of float32, {cores} CPU core{'s' * (cores > 1)}, "
          f"best of {args.repeats} repeats" + ("" if gloo_available() or not gloo else
                                               "; gloo skipped: torch is not installed"))
    ceiling = memcpy_ceiling(sizes)
    for n in args.worlds:
        sweeps = [lambda: run_minidist(n, sizes, algorithms)]
        if not args.no_mpi:
            sweeps.append(lambda: run_mpi(n, sizes, __file__))
        if gloo:
            sweeps.append(lambda: run_gloo(n, sizes, "all_reduce"))
        best = best_of(sweeps, args.repeats, dict(ceiling))
        print()
        print(table(n, sizes, best, algorithms), flush=True)
        a2a = {} if args.no_all_to_all else all_to_all(n, sizes, args, gloo)
        print()
        print(_bars.verdicts(n, sizes, best, algorithms, a2a), flush=True)


def all_to_all(n: int, sizes: list[int], args, gloo: bool) -> dict:
    """bench_alltoall.py's table at world ``n`` (minidist, MPICH, gloo; no
    pairwise column), printed; its times."""
    import bench_alltoall
    sweeps = [lambda: bench_alltoall.run_minidist(n, sizes)]
    if not args.no_mpi:
        sweeps.append(lambda: run_mpi(n, sizes, bench_alltoall.__file__))
    if gloo:
        sweeps.append(lambda: run_gloo(n, sizes, "all_to_all"))
    best = best_of(sweeps, args.repeats)
    print()
    print(bench_alltoall.table(n, sizes, best), flush=True)
    return best


if __name__ == "__main__":
    main()
