"""All-to-all bandwidth: minidist's all_to_all_single vs MPICH's Alltoallv, in one run.

    python bench/bench_collectives.py --collective all_to_all   # worlds 2 and 4
    python bench/bench_alltoall.py --worlds 2 --max-size 16M

M is the bytes of float32 each rank sends and receives in all (its input), cut into N
equal parts. For each size and world: the time of one all-to-all, algbw = M / t and
busbw = algbw * (N-1)/N (nccl-tests' all-to-all factor: the share of M that leaves
the rank). minidist runs on the local shared-memory transport with the same-call
check (which carries the split sizes): through the board up to 256 KiB of input
per rank (alltoall_board.py), reading its peers' inputs in one copy above
(alltoall.py), at 4 ranks through the board in rounds up to 4 MiB
(alltoall_rounds.py); the "pairwise" column is the same call with single-copy
reads turned off (``MINIDIST_SINGLE_COPY=0``: above 256 KiB, or 4 MiB at 4
ranks, every part through the channels, two copies; below it takes the board
like the first column). The
reference is mpi4py's ``Alltoallv`` under MPICH's ``mpiexec`` (which reads its
peer's memory in one copy too, CMA, for large messages), and with ``--peer gloo``
torch.distributed's ``all_to_all_single`` on gloo. All are timed alike (best
of the timed windows, each window timed by its slowest rank, best of ``--repeats``
runs alternating them). The last column is minidist's busbw over MPICH's.

The inputs are written (ones), on both sides: an array from ``zeros`` that is
never written maps every page to the kernel's one zero page, which a read
finds in cache, so an all-to-all, which only reads its input, would measure
a copy of one 4 KiB page over and over (20-50% faster at 1 MiB).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from _args import byte_size, positive_int

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _collective_bench import (SIZES, best_of, human, iterations, row_cells,  # noqa: E402
                               run_gloo, run_mpi, slowest_rank, usable_cores, windows)


def minidist_sweep(sizes: list[int]) -> dict:
    import minidist.distributed as dist
    from minidist.backend import synchronize, xp
    n = dist.get_world_size()
    out = {}
    for size in sizes:
        count = size // 4 // n * n
        x, y = xp.ones(count, dtype="float32"), xp.ones(count, dtype="float32")  # see inputs
        splits = [count // n] * n
        for _ in range(2):  # warm up
            dist.all_to_all_single(y, x, splits, splits)
        times = []
        for _ in range(windows(size)):
            dist.barrier()
            t = time.perf_counter()
            for _ in range(iterations(size)):
                dist.all_to_all_single(y, x, splits, splits)
            synchronize()
            times.append((time.perf_counter() - t) / iterations(size))
        out[f"minidist:{size}"] = times
    return out


def run_minidist(n: int, sizes: list[int], single_copy: bool = True) -> dict:
    """One sweep in a fresh world; ``single_copy=False``: the pairwise exchange only
    (the ranks read MINIDIST_SINGLE_COPY when they start)."""
    from minidist.comm import World
    before = os.environ.get("MINIDIST_SINGLE_COPY")
    os.environ["MINIDIST_SINGLE_COPY"] = "1" if single_copy else "0"
    try:
        with World(n) as world:
            times = slowest_rank(world.run(minidist_sweep, sizes))
    finally:
        if before is None:
            del os.environ["MINIDIST_SINGLE_COPY"]
        else:
            os.environ["MINIDIST_SINGLE_COPY"] = before
    if single_copy:
        return times
    return {k.replace("minidist:", "pairwise:"): t for k, t in times.items()}


def mpi_worker(sizes: list[int]) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n = comm.size
    out = {}
    for size in sizes:
        count = size // 4 // n * n
        x, y = np.ones(count, dtype=np.float32), np.ones(count, dtype=np.float32)
        counts = [count // n] * n
        displs = [i * (count // n) for i in range(n)]
        send, recv = [x, counts, displs, MPI.FLOAT], [y, counts, displs, MPI.FLOAT]
        for _ in range(2):
            comm.Alltoallv(send, recv)
        best = float("inf")
        for _ in range(windows(size)):
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(iterations(size)):
                comm.Alltoallv(send, recv)
            best = min(best, comm.allreduce((time.perf_counter() - t) / iterations(size),
                                            op=MPI.MAX))
        out[f"mpi:{size}"] = best
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def table(n: int, sizes: list[int], best: dict) -> str:
    factor = (n - 1) / n
    sides = (("minidist", "minidist all_to_all_single"),)
    if any(k.startswith("pairwise:") for k in best):
        sides += (("pairwise", "pairwise (2 copies)"),)
    sides += (("mpi", "MPICH Alltoallv"),)
    if any(k.startswith("gloo:") for k in best):
        sides += (("gloo", "gloo all_to_all_single"),)
    head = f"{'size':>8} | " + " | ".join(f"{title:^26}" for _, title in sides) + \
        f" | {'minidist/MPICH':>14}"
    sub = (f"{'':>8} | " + " | ".join([f"{'time':>9} {'algbw':>7} {'busbw':>8}"] * len(sides))
           + " |")
    lines = [f"world {n}  (busbw = algbw * (N-1)/N = algbw * {factor:.2f}; GB/s = 1e9 B/s)"]
    if n > usable_cores():
        lines.append(f"{n} ranks on {usable_cores()} cores: ranks share the cores (both sides)")
    lines += [head, sub, "-" * len(head)]
    for size in sizes:
        cells, bus = row_cells(best, size, n, [key for key, _ in sides], "all_to_all")
        ratio = (f"{bus['minidist'] / bus['mpi']:13.2f}x" if "minidist" in bus and "mpi" in bus
                 else f"{'-':>14}")
        lines.append(f"{human(size):>8} | " + " | ".join(cells) + " | " + ratio)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=positive_int, nargs="+", default=[2, 4])
    p.add_argument("--min-size", type=byte_size, default=1 << 10)
    p.add_argument("--max-size", type=byte_size, default=256 << 20)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--no-mpi", action="store_true", help="skip the MPICH reference")
    p.add_argument("--no-pairwise", action="store_true",
                   help="skip the pairwise (two-copy) column")
    p.add_argument("--peer", choices=("gloo", "none"), help="also run torch.distributed's gloo")
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mpi_worker:
        mpi_worker([int(s) for s in args.sizes.split(",")])
        return
    sizes = [s for s in SIZES if args.min_size <= s <= args.max_size]
    if not sizes:
        p.error(f"no size between --min-size {args.min_size} and --max-size {args.max_size}: "
                "the sizes are 1K, 4K, 16K, ... 256M (powers of 4)")
    print(f"all-to-all of float32, {usable_cores()} CPU cores, best of {args.repeats} repeats")
    for n in args.worlds:
        sweeps = [lambda: run_minidist(n, sizes)]
        if not args.no_pairwise:
            sweeps.append(lambda: run_minidist(n, sizes, single_copy=False))
        if not args.no_mpi:
            sweeps.append(lambda: run_mpi(n, sizes, __file__))
        if args.peer == "gloo":
            sweeps.append(lambda: run_gloo(n, sizes, "all_to_all"))
        best = best_of(sweeps, args.repeats)
        print()
        print(table(n, sizes, best), flush=True)


if __name__ == "__main__":
    main()
