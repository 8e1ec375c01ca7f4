"""Every demo runs and its printed check passes (smoke test, short settings: smoke.py).

Each runs in a subprocess, under the backend of this test run, with a timeout so
a stuck demo cannot hang the suite.
"""
import os
import subprocess
import sys

import pytest

from tests.demos.smoke import DEMOS, SMOKE_ARGS


@pytest.mark.parametrize("name", sorted(SMOKE_ARGS))
def test_demo_runs_and_its_check_passes(name):
    proc = subprocess.run([sys.executable, str(DEMOS / name), *SMOKE_ARGS[name]],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = [line for line in proc.stdout.splitlines() if line.startswith("check:")]
    assert checks and all("FAILED" not in c for c in checks), proc.stdout[-3000:]


@pytest.mark.host_only   # a listing of files: no backend array
def test_every_numbered_demo_has_smoke_arguments():
    numbered = {p.name for p in DEMOS.glob("[0-9][0-9]_*.py")}
    assert numbered <= set(SMOKE_ARGS), f"add smoke arguments for {numbered - set(SMOKE_ARGS)}"
