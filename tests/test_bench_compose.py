"""bench/bench_compose.py at its default model, one step: the composed 8-rank step beside
the 3D entry point and the planner's prediction, each line printed. (What the figures
are is the benchmark's to print; no time is asserted here.)"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_compose_prints_both_ways_and_the_planners_prediction():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_compose.py"),
                             "--steps", "1", "--rounds", "1"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [ln.split()[0] for ln in lines if ln.split()[:1] in (["3D"], ["composed"])] == \
        ["3D", "composed"]
    assert any(ln.startswith("planner, this machine:") for ln in lines), result.stdout
