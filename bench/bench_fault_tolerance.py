"""Time lost to one failure: per-step fault tolerance against a restart from a checkpoint.

    python bench/bench_fault_tolerance.py                  # 40 steps, 1 GB/s link, a drawn kill step
    python bench/bench_fault_tolerance.py --link-gbps 0.1 --ckpt-every 20 --seed 3

The three runs of demos/27_fault_tolerance.py (uninterrupted; a replica killed and
the spare healed; the same kill in a world that stops and restarts from the checkpoint
written every k steps), each on the emulated link (comm/transport/link.py), with the
kill at a step s drawn from --seed. The lost time is measured directly, from time
stamps on one clock for every process (rank 0's step starts and commits, the victim's
kill): from the kill to the first commit that takes the run past where it was (the
next step's, per-step FT; the failed step's, redone, restart), and

    lost = that commit's time - the failed step's start - T_commit

(T_commit: the median start-to-commit of a step, the part of the step that commit did;
the rest is the failed step's pass of the loop, detecting the death, the new quorum and
healing, or the new world, the reload and the steps since the checkpoint). Beside it,
the goodput formula (docs/fault_tolerance.md) with its terms measured in the same runs,
T_step being one pass of the training loop (the median start-to-next-start: quorum,
forward, backward, all-reduce, commit and the held-out loss the demo takes after each):

    per-step FT:  T_lost = T_step + T_detect + T_heal            (the dropped step, the transfer)
    restart:      T_lost = T_detect + T_start + T_reload + (s - c + 1) T_step

T_heal runs from the source beginning to form the quorum that heals the spare (its
groups, the exchange of steps, the sending) to the healed spare holding the state, loaded
(``demo.heal_seconds``: each rank's ``QuorumChange.began`` / ``ended``, time.monotonic(),
which on Linux is CLOCK_MONOTONIC, one clock for every process; perf_counter is not).
T_detect is the operating system's: from the kill to the launcher seeing the death
(``World.noticed``), which it can do only once the kernel has torn the killed process
down and readied its sentinel; the survivors then see it at their next empty poll. The
last line checks the bar, one step plus the healing transfer, with T_detect beside it
(lost <= T_step + T_detect + T_heal), and says whether it held without T_detect too.
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
    with tempfile.TemporaryDirectory() as tmp:
        paths = {k: os.path.join(tmp, f"{k}.marks") for k in ("base", "ft", "restart")}
        demo.ft_run(args, (-1, -1), paths["base"])
        survivors = demo.ft_run(args, (1, args.kill_step), paths["ft"])
        ft = survivors[0]
        restart = demo.restart_run(args, os.path.join(tmp, "ckpt.minidist"),
                                   _as_uninterrupted(demo, paths["base"]), paths["restart"])
        marks = {k: demo.read_marks(p) for k, p in paths.items()}
    step, commit = demo.step_seconds(marks["base"]), demo.commit_seconds(marks["base"])
    heal = demo.heal_seconds(survivors)
    detect = demo.detect_seconds(marks["ft"], ft["noticed"])
    detect_restart = demo.detect_seconds(marks["restart"], restart["noticed"])
    redo = args.kill_step - restart["resume"] + 1
    rows = [("per-step FT", *demo.time_lost(marks["ft"], commit), step + detect + heal,
             f"T_step {step:.3f} + T_detect {detect:.3f} + T_heal {heal:.3f}"),
            ("restart", *demo.time_lost(marks["restart"], commit),
             detect_restart + restart["start_s"] + restart["load_s"] + redo * step,
             f"T_detect {detect_restart:.3f} + T_start {restart['start_s']:.3f} + "
             f"T_reload {restart['load_s']:.3f} + {redo} x T_step")]
    print(f"{args.steps} steps, kill at step {args.kill_step} (seed {args.seed}), checkpoint "
          f"every {args.ckpt_every}, {args.link_gbps:g} GB/s emulated link, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"one step of the loop T_step {step:.4f} s (start to next start), of which start to "
          f"commit T_commit {commit:.4f} s")
    print(f"{'run':<13}{'kill->commit s':>15}{'lost s':>9}{'formula s':>11}   terms")
    for name, interval, lost, formula, terms in rows:
        print(f"{name:<13}{interval:>15.3f}{lost:>9.3f}{formula:>11.3f}   {terms}")
    ft_lost = rows[0][2]
    verdict = "yes" if ft_lost <= step + detect + heal else "no"
    alone = "yes" if ft_lost <= step + heal else "no"
    print(f"per-step FT lost at most one step plus the healing transfer, and the OS's "
          f"detection ({ft_lost:.3f} <= {step:.3f} + {detect:.3f} + {heal:.3f}): {verdict}; "
          f"without T_detect: {alone}")


def _as_uninterrupted(demo, path):
    """What restart_run takes of the uninterrupted run: its per-step times and losses
    (only for the demo's figure; the bench reads the marks)."""
    marks = demo.read_marks(path)
    first = marks[0][2]
    commits = [(s, t - first) for w, s, t in marks if w == "commit"]
    return {"times": [t for _, t in commits], "losses": [(s, 0.0) for s, _ in commits]}


if __name__ == "__main__":
    main()
