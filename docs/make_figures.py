"""Regenerate every figure of the docs by running the demo that draws it.

    python docs/make_figures.py               # all of them, into docs/figures/
    python docs/make_figures.py 04_ddp_buckets.png 10_flash_memory.png
    python docs/make_figures.py --list        # the table below, nothing run

Each figure comes from one demo run with ``--figure docs/figures/<name>``
(matplotlib needed: ``pip install 'minidist[plot]'``), at sizes that keep the
whole set to a few minutes on 2 cores. The demo's own check must pass, or the
figure is not trusted: the script stops with the demo's output.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
FIGURES_DIR = REPO / "docs" / "figures"

# figure file -> (demo, its arguments, extra environment); the docs page that
# shows the figure names the same demo and command
FIGURES = {
    "01_training.png": ("01_autograd.py", ["--steps", "200", "--n-embd", "64"], {}),
    "01_training_guard.png": ("01_autograd.py", ["--steps", "120", "--n-embd", "64"],
                              {"MINIDIST_BACKEND": "guard"}),
    "03_ring_allreduce.png": ("03_ring_allreduce.py", [], {}),
    "04_ddp_buckets.png": ("04_ddp.py", [], {}),
    "18_compression.png": ("18_compression.py", [], {}),
    "05_zero_memory.png": ("05_zero.py", [], {}),
    "06_tensor_parallel.png": ("06_tensor_parallel.py", [], {}),
    "07_pipeline.png": ("07_pipeline.py", [], {}),
    "08_3d_mesh.png": ("08_3d_parallel.py", ["--steps", "5"], {}),
    "09_precision.png": ("09_mixed_precision.py", ["--steps", "100"], {}),
    "23_block_scaling.png": ("23_block_scaling.py", ["--steps", "150"], {}),
    "10_flash_memory.png": ("10_flash_attention.py", ["--lengths", "256", "512", "1024"], {}),
    "11_ring_attention.png": ("11_ring_attention.py", ["--length", "1024"], {}),
    "12_checkpoints.png": ("12_checkpoints.py", [], {}),
    "15_moe.png": ("15_moe.py", [], {}),
    "16_ulysses.png": ("16_ulysses.py", [], {}),
    "17_zero_bubble.png": ("17_zero_bubble.py", [], {}),
    "24_planner.png": ("24_planner.py", [], {}),
    "20_trace.png": ("20_trace.py", [], {}),
    "21_llama.png": ("21_llama.py", [], {}),
    "22_placements.png": ("22_placements.py", [], {}),
    "25_diloco.png": ("25_diloco.py", [], {}),
    "26_muon.png": ("26_muon.py", ["--steps", "300"], {}),
    "27_fault_tolerance.png": ("27_fault_tolerance.py", [], {}),
    "28_overlap_tp.png": ("28_overlap.py", ["--pair", "tp"], {}),
    "28_overlap_pipeline.png": ("28_overlap.py", ["--pair", "pipeline"], {}),
    "28_overlap_moe.png": ("28_overlap.py", ["--pair", "moe"], {}),
    "28_overlap_fsdp.png": ("28_overlap.py", ["--pair", "fsdp"], {}),
}


def command(name: str) -> str:
    """The shell command that makes one figure, as the docs pages quote it."""
    demo, args, env = FIGURES[name]
    prefix = "".join(f"{k}={v} " for k, v in env.items())
    return f"{prefix}python demos/{demo} {' '.join(args + ['--figure', f'docs/figures/{name}'])}"


def make(name: str) -> float:
    """Run the demo behind ``name``; return the seconds it took."""
    demo, args, env = FIGURES[name]
    out = FIGURES_DIR / name
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "demos" / demo), *args, "--figure", str(out)],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"{command(name)} failed (exit {proc.returncode}):\n"
                 f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return seconds


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for name in FIGURES:
            print(f"{name:<26} {command(name)}")
        return 0
    names = argv or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        sys.exit(f"unknown figures {unknown}; known: {list(FIGURES)}")
    FIGURES_DIR.mkdir(exist_ok=True)
    total = time.perf_counter()
    for name in names:
        seconds = make(name)
        size = (FIGURES_DIR / name).stat().st_size
        print(f"wrote docs/figures/{name:<26} {size / 1024:6.1f} KiB  {seconds:6.1f} s  "
              f"({FIGURES[name][0]})", flush=True)
    print(f"{len(names)} figures in {time.perf_counter() - total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
