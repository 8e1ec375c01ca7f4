"""Time lost to one failure: per-step fault tolerance against a restart from a checkpoint.

    python bench/bench_fault_tolerance.py                  # 40 steps, 1 GB/s link, a drawn kill step
    python bench/bench_fault_tolerance.py --link-gbps 0.1 --ckpt-every 20 --seed 3

The three runs of demos/27_fault_tolerance.py (uninterrupted; a replica killed and
the spare healed; the same kill in a world that stops and restarts from the checkpoint
written every k steps), each on the emulated link (comm/transport/link.py), with the
kill at a step s drawn from --seed. For each failing run it prints the time lost,
measured, beside the goodput formula (docs/fault_tolerance.md) with its terms
measured in the same runs:

    per-step FT:  T_lost = T_step + T_heal            (the dropped step, the transfer)
    restart:      T_lost = T_start + T_reload + (s - c + 1) T_step

Measured: a run's training time (its first world's start left out) minus the
uninterrupted run's, plus, for per-step FT, the one step whose update it dropped (it
takes as many iterations as the uninterrupted run, one of them without an update).
"""
from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import random
import sys
import tempfile

from _args import positive, positive_int

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "demos"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--ckpt-every", type=positive_int, default=10)
    parser.add_argument("--seed", type=positive_int, default=1, help="draws the kill step")
    parser.add_argument("--link-gbps", type=positive, default=1.0)
    parser.add_argument("--width", type=positive_int, default=64)
    parser.add_argument("--batch", type=positive_int, default=32)
    args = parser.parse_args()
    os.environ["MINIDIST_LINK_GBPS"] = str(args.link_gbps)    # every world of the runs
    demo = importlib.import_module("27_fault_tolerance")       # its runs, imported by name
    args.kill_step = random.Random(args.seed).randrange(1, args.steps - 1)
    args.lr = 3e-3
    base = demo.ft_run(args, (-1, -1))[0]
    ft = demo.ft_run(args, (1, args.kill_step))[0]
    with tempfile.TemporaryDirectory() as tmp:
        restart = demo.restart_run(args, os.path.join(tmp, "ckpt.minidist"), base)
    times = base["times"]
    step = (times[-1] - times[0]) / (len(times) - 1)
    heal = max(c.seconds for c in ft["changes"] if c.healed and c.step > 0)
    redo = args.kill_step - restart["resume"] + 1
    rows = [("per-step FT", ft["times"][-1] - times[-1] + step, step + heal,
             f"T_step {step:.3f} + T_heal {heal:.3f}"),
            ("restart", restart["train_s"] - times[-1],
             restart["start_s"] + restart["load_s"] + redo * step,
             f"T_start {restart['start_s']:.3f} + T_reload {restart['load_s']:.3f} + "
             f"{redo} x T_step")]
    print(f"{args.steps} steps, kill at step {args.kill_step} (seed {args.seed}), checkpoint "
          f"every {args.ckpt_every}, {args.link_gbps:g} GB/s emulated link, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'run':<13}{'lost s':>8}{'formula s':>11}   terms")
    for name, lost, formula, terms in rows:
        print(f"{name:<13}{lost:>8.3f}{formula:>11.3f}   {terms}")


if __name__ == "__main__":
    main()
