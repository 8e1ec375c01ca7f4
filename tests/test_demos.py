"""Every demo runs and its printed check passes (smoke test, short settings).

Each demo prints a line starting with ``check:`` and exits non-zero when the
check fails; here each runs in a subprocess, under the backend of this test
run, with a timeout so a stuck demo cannot hang the suite.
"""
import os
import re
import pathlib
import subprocess
import sys

import pytest

from minidist import backend

DEMOS = pathlib.Path(__file__).resolve().parents[1] / "demos"

# demo file -> the short arguments used in CI (defaults must stay runnable too)
SMOKE_ARGS = {
    "01_autograd.py": ["--steps", "120", "--n-embd", "64", "--dropout", "0"],
    "02_collectives.py": [],
    "03_ring_allreduce.py": ["--mib", "1", "--max-mib", "1"],
    "04_ddp.py": ["-n", "2", "--steps", "3", "--width", "64"],
    "05_zero.py": ["-n", "2", "--width", "32", "--steps", "2"],
    "06_tensor_parallel.py": ["-n", "2", "--n-layer", "1", "--n-embd", "16"],
    "07_pipeline.py": ["-p", "2", "-m", "4"],
    "08_3d_parallel.py": ["--steps", "2"],
    "09_mixed_precision.py": ["--steps", "40", "--n-embd", "32"],
    "10_flash_attention.py": ["--lengths", "256", "512"],
    "11_ring_attention.py": ["-n", "2", "--length", "256"],
    "12_checkpoints.py": ["--width", "8", "--steps", "4", "--save-at", "2"],
    "13_diagnostics.py": ["-n", "2", "--steps", "4", "--bug-step", "2", "--bug-rank", "1"],
    "14_cost_models_observed.py": ["--points", "64,32,4", "128,64,2"],
    "17_zero_bubble.py": ["-p", "2", "-m", "4", "--op-ms", "5"],
    "15_moe.py": ["-n", "2", "--steps", "5"],
    "16_ulysses.py": ["-n", "2", "--lengths", "64", "128"],
    "18_compression.py": ["--steps", "8", "--width", "64"],
    "25_diloco.py": ["--steps", "20", "--width", "16", "--block", "16"],
    "24_planner.py": ["--model", "llama3-8b", "--gpus", "16", "--batch-tokens", "262144",
                      "--seq", "4096", "--no-published"],
    "19_topology.py": ["-n", "4", "--node-size", "2"],
    "20_trace.py": ["--dp", "1", "--pp", "2", "--tp", "1", "--steps", "1"],
    "21_llama.py": ["--steps", "4"],
    "22_placements.py": ["-n", "2", "--width", "4", "--n-embd", "8"],
    "23_block_scaling.py": ["--steps", "16", "--n-embd", "32"],
    "26_muon.py": ["--steps", "20"],
    "27_fault_tolerance.py": ["--steps", "8", "--kill-step", "5", "--ckpt-every", "4",
                              "--width", "16"],
    "28_overlap.py": ["--pair", "moe", "--width", "16", "--seq", "8", "--batch", "2"],
}


@pytest.mark.parametrize("name", sorted(SMOKE_ARGS))
def test_demo_runs_and_its_check_passes(name):
    proc = subprocess.run([sys.executable, str(DEMOS / name), *SMOKE_ARGS[name]],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = [line for line in proc.stdout.splitlines() if line.startswith("check:")]
    assert checks and all("FAILED" not in c for c in checks), proc.stdout[-3000:]


def test_every_numbered_demo_has_smoke_arguments():
    numbered = {p.name for p in DEMOS.glob("[0-9][0-9]_*.py")}
    assert numbered <= set(SMOKE_ARGS), f"add smoke arguments for {numbered - set(SMOKE_ARGS)}"


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


def run_under_minidist_run(name: str, *flags: str) -> subprocess.CompletedProcess:
    """``minidist run -n 2 [flags] demos/NAME`` with the demo's smoke arguments."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    return subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2", *flags,
                           str(DEMOS / name), *SMOKE_ARGS[name]],
                          capture_output=True, text=True, timeout=240, env=env)


ONE_LINE_REASON = re.compile(r"^\[rank 0\] (\d\d_\w+\.py) runs as one process: .+\. "
                             r"Run it as `python \S*\1`\.$")


@pytest.mark.skipif(backend.get_backend() != "numpy",
                    reason="the launcher, not the math: the demos' checks run on every "
                           "backend in test_demo_runs_and_its_check_passes")
@pytest.mark.parametrize("name", sorted(SMOKE_ARGS))
def test_demo_runs_under_minidist_run_or_says_in_one_line_why_not(name):
    """Each rank joins the launched world, or the demo runs whole on each rank, or rank 0
    prints one line saying why the demo starts worlds of its own; never a traceback."""
    proc = run_under_minidist_run(name)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, out
    lines = proc.stdout.splitlines()
    if len(lines) == 1:
        assert ONE_LINE_REASON.match(lines[0]), lines[0]
        return
    checks = [line for line in lines if re.sub(r"^\[rank \d+\] ", "", line).startswith("check:")]
    assert checks and all("FAILED" not in c for c in checks), out


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


# a bad number, or numbers that do not fit together, and the reason the demo gives
BAD_ARGS = [
    ("02_collectives.py", ["-n", "0"], "positive integer"),
    ("01_autograd.py", ["--n-head", "3"], "not divisible by n_head"),
    ("01_autograd.py", ["--dropout", "1"], "[0, 1)"),
    ("03_ring_allreduce.py", ["-n", "1"], "at least 2"),
    ("04_ddp.py", ["--bucket-mb", "0"], "> 0"),
    ("06_tensor_parallel.py", ["--tp", "3"], "must divide"),
    ("07_pipeline.py", ["-p", "3"], "multiple of -p"),
    ("08_3d_parallel.py", ["--tp", "3"], "must divide"),
    ("11_ring_attention.py", ["-n", "3"], "divisible by 2 x -n"),
    ("11_ring_attention.py", ["--window", "8", "--no-causal"], "needs causal"),
    ("12_checkpoints.py", ["--steps", "3"], "below --steps"),
    ("13_diagnostics.py", ["--bug-rank", "9"], "rank below -n"),
    ("15_moe.py", ["--top-k", "9"], "at most --experts"),
    ("16_ulysses.py", ["--lengths", "3"], "divisible by -n"),
    ("18_compression.py", ["--steps", "-2"], "positive integer"),
    ("24_planner.py", ["--model", "gpt9"], "unknown model preset"),
    ("19_topology.py", ["-n", "3"], "must divide"),
    ("21_llama.py", ["--tp", "4"], "must divide the 2 key/value heads"),
    ("22_placements.py", ["-n", "3"], "must divide --width"),
]


@pytest.mark.parametrize("name,args,reason", BAD_ARGS, ids=[f"{n} {' '.join(a)}" for n, a, _ in BAD_ARGS])
def test_a_bad_argument_is_a_usage_error_not_a_traceback(name, args, reason):
    proc = subprocess.run([sys.executable, str(DEMOS / name), *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "usage:" in proc.stderr, proc.stderr[-2000:]
    assert reason in proc.stderr, proc.stderr[-2000:]
