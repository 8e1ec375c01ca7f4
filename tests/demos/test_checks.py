"""Every demo runs and its printed check passes (smoke test, short settings: smoke.py),
as ``python demos/NAME`` and under ``minidist run -n 2``.

Each runs in a subprocess, under the backend of this test run, with a timeout so
a stuck demo cannot hang the suite. A demo that runs whole on each rank under the
launcher (``WHOLE_ON_EACH_RANK``) runs once on the NumPy pass: that launched run is two
``python demos/NAME`` runs with the same arguments, so both tests read its output (each
rank's check lines); the other passes run it alone.
"""
import functools
import os
import re
import subprocess
import sys

import pytest

from minidist.backend import get_backend
from tests.demos.smoke import DEMOS, SMOKE_ARGS, WHOLE_ON_EACH_RANK, run_under_minidist_run

RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ")
ONE_LINE_REASON = re.compile(r"^\[rank 0\] (\d\d_\w+\.py) runs as one process: .+\. "
                             r"Run it as `python \S*\1`\.$")


@functools.cache
def launched(name: str) -> subprocess.CompletedProcess:
    """``minidist run -n 2`` of the demo, once per test module."""
    return run_under_minidist_run(name)


def checks_of(stdout: str) -> list:
    """The ``check:`` lines of a run, a launched rank's ``[rank N]`` prefix dropped."""
    lines = (RANK_PREFIX.sub("", line) for line in stdout.splitlines())
    return [line for line in lines if line.startswith("check:")]


@pytest.mark.parametrize("name", sorted(SMOKE_ARGS))
def test_demo_runs_and_its_check_passes(name):
    if name in WHOLE_ON_EACH_RANK and get_backend() == "numpy":
        proc = launched(name)          # each rank is this run (module docstring)
    else:
        proc = subprocess.run([sys.executable, str(DEMOS / name), *SMOKE_ARGS[name]],
                              capture_output=True, text=True, timeout=240,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = checks_of(proc.stdout)
    assert checks and all("FAILED" not in c for c in checks), proc.stdout[-3000:]


@pytest.mark.launcher   # the launcher, not the math: the NumPy pass only (tests/conftest.py)
@pytest.mark.parametrize("name", sorted(SMOKE_ARGS))
def test_demo_runs_under_minidist_run_or_says_in_one_line_why_not(name):
    """Each rank joins the launched world, or the demo runs whole on each rank, or rank 0
    prints one line saying why the demo starts worlds of its own; never a traceback."""
    proc = launched(name)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, out
    lines = proc.stdout.splitlines()
    if len(lines) == 1:
        assert ONE_LINE_REASON.match(lines[0]), lines[0]
        assert name not in WHOLE_ON_EACH_RANK, lines[0]
        return
    checks = checks_of(proc.stdout)
    assert checks and all("FAILED" not in c for c in checks), out
    if name in WHOLE_ON_EACH_RANK:     # both ranks ran the whole demo: the same check lines
        by_rank = {r: [RANK_PREFIX.sub("", line) for line in lines
                       if line.startswith(f"[rank {r}] check:")] for r in "01"}
        assert by_rank["0"] and by_rank["0"] == by_rank["1"], out


@pytest.mark.host_only   # a listing of files: no backend array
def test_every_numbered_demo_has_smoke_arguments():
    numbered = {p.name for p in DEMOS.glob("[0-9][0-9]_*.py")}
    assert numbered <= set(SMOKE_ARGS), f"add smoke arguments for {numbered - set(SMOKE_ARGS)}"
    assert WHOLE_ON_EACH_RANK <= set(SMOKE_ARGS)
