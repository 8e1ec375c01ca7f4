"""The README's launcher commands: `minidist run` and `mpiexec` start demos as ranks of a
world (every demo under `minidist run`: test_checks.py)."""
import os
import re
import subprocess
import sys

import pytest

from tests.demos.smoke import DEMOS, run_under_minidist_run

# the launcher, not the math: the demos' checks run on every backend in test_checks.py
pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)


@pytest.mark.parametrize("launcher", ["minidist run", "mpiexec"])
def test_the_readme_starts_demo_02_under_a_launcher(launcher):
    """README: `minidist run -n 4 demos/02_collectives.py` and `mpiexec -n 4 python
    demos/02_collectives.py` run the same demo as one rank each."""
    if launcher == "mpiexec":
        import shutil
        mpiexec = shutil.which("mpiexec")
        if mpiexec is None:
            pytest.skip("mpiexec not on PATH (pip install -e '.[mpi]')")
        cmd = [mpiexec, "-n", "3", sys.executable, str(DEMOS / "02_collectives.py")]
    else:
        cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "3",
               str(DEMOS / "02_collectives.py")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [re.sub(r"^\[rank \d+\] ", "", line) for line in proc.stdout.splitlines()]
    checks = [line for line in lines if line.startswith("check:")]
    assert len(checks) == 1 and checks[0].endswith("ok"), proc.stdout[-3000:]
    assert "3 processes" in proc.stdout


def test_demo_04_under_minidist_run_writes_a_trace_that_summary_reads(tmp_path):
    """README: `minidist run -n 4 --trace run.json demos/04_ddp.py`, then
    `minidist trace summary run.json`."""
    trace = tmp_path / "run.json"
    proc = run_under_minidist_run("04_ddp.py", "--trace", str(trace))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "check: max |ddp - single|" in proc.stdout and "2 ranks" in proc.stdout
    summary = subprocess.run([sys.executable, "-m", "minidist.cli", "trace", "summary",
                              str(trace)], capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert "rank 0" in summary.stdout and "rank 1" in summary.stdout
