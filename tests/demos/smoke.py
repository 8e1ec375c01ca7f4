"""The demos' short settings for the suite.

Each demo prints a line starting with ``check:`` and exits non-zero when the
check fails; test_checks.py runs each with these arguments, alone and under
``minidist run``, test_launched.py the README's launcher commands, test_usage.py
bad arguments.
"""
import os
import pathlib
import subprocess
import sys

DEMOS = pathlib.Path(__file__).resolve().parents[2] / "demos"

# demo file -> the short arguments used in CI (defaults must stay runnable too)
SMOKE_ARGS = {
    "01_autograd.py": ["--steps", "60", "--n-embd", "64", "--dropout", "0"],
    "02_collectives.py": [],
    "03_ring_allreduce.py": ["--mib", "1", "--max-mib", "1"],
    "04_ddp.py": ["-n", "2", "--steps", "3", "--width", "64"],
    "05_zero.py": ["-n", "2", "--width", "32", "--steps", "2"],
    "06_tensor_parallel.py": ["-n", "2", "--n-layer", "1", "--n-embd", "16"],
    "07_pipeline.py": ["-p", "2", "-m", "4"],
    "08_3d_parallel.py": ["--steps", "2"],
    "09_mixed_precision.py": ["--steps", "16", "--n-embd", "32"],
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
    "29_compose.py": ["--steps", "2"],
}

# The demos that start no world and join none: under ``minidist run`` each rank runs the
# whole demo, the same ``python demos/NAME`` run with the same arguments (test_checks.py).
WHOLE_ON_EACH_RANK = {"01_autograd.py", "09_mixed_precision.py", "10_flash_attention.py",
                      "14_cost_models_observed.py", "23_block_scaling.py", "24_planner.py",
                      "26_muon.py"}


def run_under_minidist_run(name: str, *flags: str) -> subprocess.CompletedProcess:
    """``minidist run -n 2 [flags] demos/NAME`` with the demo's smoke arguments."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    return subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2", *flags,
                           str(DEMOS / name), *SMOKE_ARGS[name]],
                          capture_output=True, text=True, timeout=240, env=env)
