"""Demo 07: pipeline parallelism: GPipe, 1F1B and interleaved 1F1B, timed in real processes.

A model cut into p stages (one per process) trains on m micro-batches per step.
For each schedule the demo prints

- its timeline on an ideal machine (a forward takes one slot, a backward two;
  F3 = forward of micro-batch 3, B3 its backward; b = the rank's second model chunk),
- the same schedule run in p processes, each op padded to a fixed cost
  (forward t_f, backward 2 t_f: equal-cost stages), drawn from the measured times,
- the measured bubble (idle time over ideal compute time) beside the formula
  (minidist.calc.pipeline):  GPipe and 1F1B (p-1)/m,   interleaved (p-1)/(m v),
  and the peak number of micro-batches whose activations a stage held
  (GPipe m, 1F1B p - stage),
- that a GPT cut into pieces gets the single-process gradients under every schedule.

    python demos/07_pipeline.py                 # p = 4, m = 8, v = 2, ~10 s
    python demos/07_pipeline.py -p 2 -m 4 --op-ms 10
    python demos/07_pipeline.py --figure /tmp/pipeline.png   # also draw the timelines

With --figure PATH (no figure without it) it saves the measured timelines as
a PNG (needs matplotlib).

Code: minidist/parallel/pipeline/schedule.py (schedules, ASCII timelines),
executor.py (executor, measurement), gpt.py (GPT pieces).
"""
import argparse
import sys

import numpy as np

from minidist.backend import from_host, to_host
from minidist.calc.pipeline import bubble_fraction, peak_inflight_microbatches
from minidist.comm import World
from minidist.distributed import barrier, get_rank, get_world_size
from _pipeline_piece import Piece, reference_gpt
from minidist.nn import GPT
from minidist.parallel import (make_schedule, measured_bubble, pieces_of_rank, render_timeline,
                               run_pipeline, simulate, split_gpt, sync_tied_gradients)
from _args import non_negative, positive_int
from _launched import one_process_only

MARGIN = 0.06      # measured bubbles run high: message and wake-up latency only add idle time
TOLERANCE = 1e-12


def timed(schedule, m, v, op_s):
    p, r = get_world_size(), get_rank()
    chunks = [Piece(c * p + r == p * v - 1) for c in range(v)]
    ops = make_schedule(schedule, p, m, v)[r]
    inputs = [from_host(np.ones((2, 8))) for _ in range(m)]
    barrier()
    stats = run_pipeline(ops, chunks, m, inputs, [None] * m, activation_shape=(2, 8),
                         dtype="float64", op_seconds=(op_s, 2 * op_s))
    return stats.timeline, stats.peak_inflight


def gpt_grads(cfg, schedule, m, v, idx, tgt):
    p, r = get_world_size(), get_rank()
    model = GPT(cfg)
    chunks = pieces_of_rank(split_gpt(model, p, v), r, p)
    ops = make_schedule(schedule, p, m, v)[r]
    run_pipeline(ops, chunks, m, [from_host(a) for a in np.split(idx, m)],
                 [from_host(a) for a in np.split(tgt, m)],
                 activation_shape=(idx.shape[0] // m, cfg.block_size, cfg.n_embd),
                 dtype=cfg.dtype)
    sync_tied_gradients(model, chunks)
    mine = {id(q) for c in chunks for q in c.parameters()}
    return {n: to_host(q.grad) for n, q in model.named_parameters() if id(q) in mine}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-p", "--stages", type=positive_int, default=4)
    parser.add_argument("-m", "--microbatches", type=positive_int, default=8)
    parser.add_argument("-v", "--virtual", type=positive_int, default=2,
                        help="chunks per rank (interleaved)")
    parser.add_argument("--op-ms", type=non_negative, default=20.0,
                        help="forward cost of a stage (ms)")
    parser.add_argument("--figure", metavar="PATH",
                        help="save the measured timelines as a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts its own world of pipeline stages and compares it with one process")
    p, m, v, op_s = args.stages, args.microbatches, args.virtual, args.op_ms / 1e3
    if m % p:
        parser.error(f"the interleaved schedule needs -m ({m}) to be a multiple of -p ({p})")
    runs = [("gpipe", 1), ("1f1b", 1), ("interleaved", v)]

    cfg, idx, tgt, want = reference_gpt(p * v, m)

    ok, measured = True, {}
    with World(p) as world:
        for name, vv in runs:
            print(f"\n=== {name} (p = {p}, m = {m}" + (f", v = {vv})" if vv > 1 else ")"))
            print("ideal (forward 1 slot, backward 2):")
            ideal = simulate(make_schedule(name, p, m, vv), vv, forward_cost=1, backward_cost=2)
            print(render_timeline(ideal, slot=1 / vv))
            # GPipe idles as long as 1F1B: (p-1)/m of the ideal compute time
            formula = bubble_fraction(p, m, "1f1b" if name == "gpipe" else name, vv)
            # latency only ever adds idle time, so the least of a few runs is the best
            # estimate; a run is repeated only when the first came out high
            for attempt in range(1, 4):
                results = world.run(timed, name, m, vv, op_s)
                timelines = [t for t, _ in results]
                got = measured_bubble(timelines)
                if got <= formula + MARGIN:
                    break
            print(f"measured in {p} processes, one cell = {1e3 * op_s / vv:.0f} ms"
                  + (f" (run {attempt} of up to 3)" if attempt > 1 else "") + ":")
            print(render_timeline(timelines, slot=op_s / vv))
            measured[name] = timelines
            # wall-clock time on a shared machine is not a check; the ideal run is
            good = formula - 0.02 <= got <= formula + MARGIN
            ok &= abs(measured_bubble(ideal) - formula) < 1e-12
            print(f"bubble (idle/compute): measured {got:.3f}, ideal "
                  f"{measured_bubble(ideal):.3f}, formula {formula:.3f}"
                  f"{'' if good else '  (machine busy: latency adds idle)'}")
            peaks = [k for _, k in results]
            if name != "interleaved":
                want_peaks = [peak_inflight_microbatches(p, m, name, r) for r in range(p)]
                ok &= peaks == want_peaks
                print(f"peak in-flight micro-batches per stage: {peaks} (formula {want_peaks})")
            else:
                print(f"peak in-flight chunk activations per stage: {peaks} (each 1/{vv} "
                      "of a stage's)")
            grads = {}
            for part in world.run(gpt_grads, cfg, name, m, vv, idx, tgt):
                grads.update(part)
            err = max(float(np.abs(grads[n] - want[n]).max()) for n in want)
            ok &= err <= TOLERANCE
            print(f"GPT in {p * vv} pieces: max |pipeline - single| over gradients = {err:.1e}")

    if args.figure:
        from _figures import pipeline_timelines
        pipeline_timelines(args.figure, measured, p)

    print(f"\ncheck: ideal bubbles equal the formulas, peak "
          f"in-flight as the formulas, gradients within {TOLERANCE:.0e} of one process  "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
