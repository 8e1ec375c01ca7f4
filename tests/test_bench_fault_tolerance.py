"""bench/bench_fault_tolerance.py at a tiny size: one row per kill in each table, the
medians, and the bar's line saying how many kills held it one by one; the restart's
terms add up to its formula (T_stop and T_init included). (What the figures are is the
benchmark's to print; no time is asserted here.)"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_prints_each_kill_the_medians_and_the_bar_on_them():
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_fault_tolerance.py"), "--kills", "2",
         "--steps", "6", "--ckpt-every", "3", "--width", "16", "--batch", "4"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    assert "2 kills at steps" in out, out
    ft, restart = out.split("per-step FT (s)")[1].split("restart (s)")
    assert len(re.findall(r"^  kill at step", ft, re.M)) == 2, out
    assert len(re.findall(r"^  kill at step", restart, re.M)) == 2, out
    assert "  median" in ft and "  median" in restart, out
    for row in re.findall(r"^  kill at step.*$", restart, re.M):
        *terms, redo, _, step, formula = row.split()[5:]      # after the lost time
        total = sum(float(t) for t in terms) + int(redo) * float(step)
        # each figure printed to 1 ms, so off by up to 0.5 ms: the terms, the step once per
        # step redone, and the formula itself (a term left out would be tens of ms)
        slack = 0.0005 * (len(terms) + int(redo) + 1) + 1e-9
        assert abs(total - float(formula)) <= slack, row
    assert re.search(r"\(median [\d.]+ <= [\d.]+ \+ [\d.]+ \+ [\d.]+\): (yes|no), \d of 2 kills "
                     r"one by one; without T_detect", out), out
