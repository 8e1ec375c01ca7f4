"""Time every numbered demo as a newcomer runs it: its defaults, nothing added.

    python docs/time_demos.py                 # all of them, one after the other
    python docs/time_demos.py 01 09 10        # only these (a number or part of the name)

Each demo runs as ``python demos/NN_name.py``; the script prints the seconds it
took (wall clock), the CPU seconds of the demo and all its processes, and its
check line, and stops with the demo's output if the demo fails or prints no
passing check. The last line gives the slowest demo, the machine's cores and
its load average while the demos ran: the times in README.md and docs/index.md
come from this script. Other work on the machine inflates the wall-clock time
most; the CPU time less (a multi-process demo's ranks add up theirs).
"""
from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEMOS = sorted((REPO / "demos").glob("[0-9][0-9]_*.py"))


def _cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)   # every process waited for
    return usage.ru_utime + usage.ru_stime


def run(demo: pathlib.Path) -> tuple[float, float, str]:
    """Run one demo with its defaults; return its wall-clock and CPU seconds and its
    last check line."""
    cpu0, t0 = _cpu_seconds_of_children(), time.perf_counter()
    proc = subprocess.run([sys.executable, str(demo)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds, cpu = time.perf_counter() - t0, _cpu_seconds_of_children() - cpu0
    checks = [line for line in proc.stdout.splitlines() if line.startswith("check:")]
    if proc.returncode != 0 or not checks or any("FAILED" in c for c in checks):
        sys.exit(f"python demos/{demo.name} failed (exit {proc.returncode}):\n"
                 f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return seconds, cpu, checks[-1]


def chosen(argv: list[str]) -> list[pathlib.Path]:
    if not argv:
        return DEMOS
    picked = []
    for name in argv:
        matches = [d for d in DEMOS if d.stem.startswith(name + "_") or name in d.stem]
        if len(matches) != 1:
            sys.exit(f"{name!r} matches {[d.name for d in matches] or 'no demo'}")
        picked += matches
    return picked


def main(argv: list[str]) -> int:
    demos = chosen(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    times = {}
    loads = []
    for demo in demos:
        seconds, cpu, check = run(demo)
        times[demo.name] = seconds
        loads.append(os.getloadavg()[0])
        print(f"{demo.name:<28} {seconds:6.1f} s  (CPU {cpu:6.1f} s)   {check[:80]}", flush=True)
    slowest = max(times, key=times.get)
    print(f"{len(times)} demos in {sum(times.values()):.0f} s; the slowest {slowest} "
          f"({times[slowest]:.1f} s); {cores} cores, load average {min(loads):.1f}-{max(loads):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
