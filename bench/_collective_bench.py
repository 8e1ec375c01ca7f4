"""What bench_collectives.py and bench_alltoall.py share: the sizes, how long to
time each, the best-of over alternating sweeps, the MPICH run under mpiexec,
the torch.distributed gloo run (``--peer gloo``), and a row of the table (time,
algbw, busbw per side)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

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


# -- torch.distributed's gloo: the CPU backend a learner would otherwise use ------------

def gloo_available() -> bool:
    """Is torch installed (its workers can import it)? Without it gloo is skipped."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def run_gloo(n: int, sizes: list[int], collective: str) -> dict:
    """``collective`` (all_reduce or all_to_all) of float32 under torch.distributed's
    gloo backend, N processes on this machine: {"gloo:<size>": seconds}; {} without torch."""
    if not gloo_available():
        return {}
    with socket.socket() as s:      # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "gloo", collective,
                               ",".join(map(str, sizes))], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(n)]
    outs = [p.communicate(timeout=1800) for p in procs]
    for line in outs[0][0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"gloo run failed:\n{outs[0][0]}\n{outs[0][1]}", file=sys.stderr)
    return {}


def gloo_worker(collective: str, sizes: list[int]) -> None:
    """One rank of run_gloo: time ``collective`` as the MPICH worker times its own."""
    import torch
    import torch.distributed as tdist
    tdist.init_process_group("gloo")
    n = tdist.get_world_size()
    out = {}
    for size in sizes:
        count = size // 4 // n * n
        x, y = torch.ones(count), torch.ones(count)
        if collective == "all_reduce":
            def call():
                tdist.all_reduce(x)
        else:
            def call():
                tdist.all_to_all_single(y, x)
        for _ in range(2):
            call()
        best = float("inf")
        for _ in range(windows(size)):
            tdist.barrier()
            t = time.perf_counter()
            for _ in range(iterations(size)):
                call()
            slowest = torch.tensor([(time.perf_counter() - t) / iterations(size)])
            tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)
            best = min(best, float(slowest))
        out[f"gloo:{size}"] = best
    if tdist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    tdist.destroy_process_group()


if __name__ == "__main__" and sys.argv[1:2] == ["gloo"]:
    gloo_worker(sys.argv[2], [int(s) for s in sys.argv[3].split(",")])
