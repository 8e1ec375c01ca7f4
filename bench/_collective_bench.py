"""What bench_collectives.py and bench_alltoall.py share: the sizes, how long to
time each, the best-of over alternating sweeps, the MPICH run under mpiexec,
and a row of the table (time, algbw, busbw per side)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from minidist.calc.comm import bus_bandwidth

SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB, 4 KiB, ..., 256 MiB


def iterations(nbytes: int) -> int:
    return int(min(1000, max(3, (1 << 27) // nbytes)))


def windows(nbytes: int) -> int:
    """Timed windows per size: a window takes milliseconds to a second, so a burst
    of other load on the machine can spoil one; the best window counts (the same
    for both sides)."""
    return 5 if nbytes <= (16 << 20) else 3


def usable_cores() -> int:
    """The cores this run may use (fewer than the machine's under taskset)."""
    return len(os.sched_getaffinity(0))


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.0f} TiB"


def slowest_rank(per_rank: list[dict], prefix: str = "") -> dict:
    """Per key: the best window, each window timed by its slowest rank (the
    all-reduce is done when every rank is done)."""
    return {prefix + k: min(max(r[k][w] for r in per_rank) for w in range(len(per_rank[0][k])))
            for k in per_rank[0]}


def run_mpi(n: int, sizes: list[int], script: str) -> dict:
    """Run ``script --mpi-worker`` under mpiexec; its rank 0 prints the RESULT line."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        return {}
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    cmd = [mpiexec, "-n", str(n), sys.executable, os.path.abspath(script), "--mpi-worker",
           "--sizes", ",".join(map(str, sizes))]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"MPICH run failed:\n{out.stdout}\n{out.stderr}", file=sys.stderr)
    return {}


def row_cells(best: dict, size: int, n: int, keys: list[str], collective: str
              ) -> tuple[list[str], dict]:
    """One size's cells, "time algbw busbw" for each of ``keys`` ('-' where one was
    not measured), and the busbw in GB/s of each measured key (calc.bus_bandwidth)."""
    cells, busbws = [], {}
    for key in keys:
        t = best.get(f"{key}:{size}")
        if t is None:
            cells.append(f"{'-':>9} {'-':>7} {'-':>8}")
            continue
        algbw = size / t / 1e9
        busbws[key] = bus_bandwidth(size, n, t, collective) / 1e9
        shown = f"{t * 1e6:.1f}us" if t < 1e-2 else f"{t * 1e3:.2f}ms"
        cells.append(f"{shown:>9} {algbw:7.2f} {busbws[key]:8.2f}")
    return cells, busbws


def best_of(sweeps: list, repeats: int, best: dict | None = None) -> dict:
    """Run every sweep (a function returning {key: seconds}) ``repeats`` times, the
    sweeps alternating so that a burst of load elsewhere hits them alike; keep the
    least time of each key."""
    best = {} if best is None else best
    for _ in range(repeats):
        for sweep in sweeps:
            for k, t in sweep().items():
                best[k] = min(t, best.get(k, float("inf")))
    return best
