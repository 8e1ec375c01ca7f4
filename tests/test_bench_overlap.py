"""bench/bench_overlap.py at a tiny size: every pair runs on the emulated link and prints
its table, with exposed communication read off a trace, and its verdict line. (What the
figures are is the benchmark's to print; no time is asserted here.)"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--rounds", "1", "--steps", "1", "--trace-steps", "1", "--layers", "1", "--width", "16",
        "--seq", "8", "--batch", "1", "--microbatches", "4"]


def test_bench_overlap_prints_every_pair_with_its_exposed_communication():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_overlap.py"), *TINY],
                         capture_output=True, text=True, timeout=240, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    for pair, overlapped in [("tp", "async TP"), ("pipeline", "DualPipeV"), ("fsdp", "float8"),
                             ("moe", "overlapped")]:
        assert f"== {pair}:" in out, out
        assert f"  {overlapped} vs " in out and "the wire allows hiding" in out, out
    assert "CPU floor" in out
    assert "== the bars, one line per overlap" in out, out
    for line in ("async TP vs plain SP:", "DualPipeV vs 1F1B:", "bfloat16 vs float32:",
                 "float8 vs float32:", "overlapped vs plain dispatch:"):
        assert line in out.split("== the bars")[1], out
    assert out.count("CPU ") >= 3 and ("pays" in out or "nothing saved or hidden" in out), out


def test_bench_overlap_refuses_an_unknown_pair():
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_overlap.py"), "--only",
                          "zero"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and "unknown pair" in run.stderr
