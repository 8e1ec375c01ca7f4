"""Demo 17: zero-bubble pipeline schedules: the backward split into B and W.

Each backward is two ops (minidist.autograd.backward_split): B, the gradient for
the stage's input, which the previous stage waits for, and W, the gradient for
its weights, which nothing downstream waits for, so W can fill the bubble.
For 1F1B, ZB-H1, ZB-H2 and ZB-V on the same p and m the demo prints

- the timeline on an ideal machine (F, B, W one slot each; 1F1B's fused
  backward two; w3 = W of micro-batch 3, b = the rank's second chunk in ZB-V's V),
- the timeline measured in p processes with every op padded to the same cost
  (T_F = T_B = T_W = --op-ms), the measured bubble (idle / ideal compute)
  beside the formula (Qi et al., ICLR 2024):
      1F1B (p-1)/m,   ZB-H1 (p-1)/(3m),   ZB-H2 and ZB-V 0,
- the peak number of micro-batch chunks a stage held (from F to W) and the
  most bytes the W closures of a GPT piece kept alive,
- that a GPT cut into pieces gets the single-process gradients under each.

    python demos/17_zero_bubble.py                 # p = 4, m = 8, ~30 s
    python demos/17_zero_bubble.py -p 2 -m 4 --op-ms 5
    python demos/17_zero_bubble.py --figure /tmp/zb.png   # 1F1B, ZB-H1, ZB-V drawn

Code: minidist/autograd/weight_grad.py (B/W split), minidist/parallel/pipeline/
zero_bubble.py (schedules), executor.py (W ops, padding, measurement).
"""
import argparse
import sys

import numpy as np

from minidist.backend import from_host, to_host
from minidist.calc.pipeline import bubble_fraction
from minidist.comm import World
from minidist.distributed import barrier, get_rank, get_world_size
from _pipeline_piece import Piece, reference_gpt
from minidist.nn import GPT
from minidist.parallel import (chunks_per_rank, make_schedule, measured_bubble, pieces_of_rank,
                               placement, render_timeline, run_pipeline, simulate, split_gpt,
                               sync_tied_gradients)
from minidist.parallel.pipeline.schedule import virtual_stage
from _args import non_negative, positive_int
from _launched import one_process_only

SCHEDULES = ("1f1b", "zb_h1", "zb_h2", "zb_v")
DRAWN = ("1f1b", "zb_h1", "zb_v")
MARGIN = 0.06      # measured bubbles run high: message and wake-up latency only add idle time
TOLERANCE = 1e-12


def timed(schedule, m, op_s, costs=(1.0, 1.0, 1.0)):
    """One step in p processes, every F, B and W padded to costs x op_s (B and W
    fused in 1F1B); returns this rank's (op, start, end) timeline and peak."""
    f, b, w = costs
    p, r = get_world_size(), get_rank()
    v, where = chunks_per_rank(schedule), placement(schedule)
    chunks = [Piece(virtual_stage(r, c, p, where) == p * v - 1) for c in range(v)]
    inputs = [from_host(np.ones((2, 8))) for _ in range(m)]
    barrier()                               # start together: a late start is not a bubble
    stats = run_pipeline(make_schedule(schedule, p, m)[r], chunks, m, inputs, [None] * m,
                         activation_shape=(2, 8), dtype="float64",
                         op_seconds=(f * op_s, (b + w) * op_s, w * op_s), placement=where)
    return stats.timeline, stats.peak_inflight


def gpt_grads(cfg, schedule, m, idx, tgt):
    p, r = get_world_size(), get_rank()
    v, where = chunks_per_rank(schedule), placement(schedule)
    model = GPT(cfg)
    chunks = pieces_of_rank(split_gpt(model, p, v), r, p, where)
    stats = run_pipeline(make_schedule(schedule, p, m)[r], chunks, m,
                         [from_host(a) for a in np.split(idx, m)],
                         [from_host(a) for a in np.split(tgt, m)],
                         activation_shape=(idx.shape[0] // m, cfg.block_size, cfg.n_embd),
                         dtype=cfg.dtype, placement=where)
    sync_tied_gradients(model, chunks)
    mine = {id(q) for c in chunks for q in c.parameters()}
    grads = {n: to_host(q.grad) for n, q in model.named_parameters() if id(q) in mine}
    return grads, stats.peak_w_bytes


def formula(name, p, m):
    try:
        return bubble_fraction(p, m, name)
    except ValueError:                      # below the m where the formula holds
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-p", "--stages", type=positive_int, default=4)
    parser.add_argument("-m", "--microbatches", type=positive_int, default=8)
    parser.add_argument("--op-ms", type=non_negative, default=20.0,
                        help="cost of each F, B and W of a whole stage (ms)")
    parser.add_argument("--unequal", default="1,1.5,0.5", metavar="F,B,W",
                        help="relative costs of F, B and W for the second table, measured "
                             "beside the simulator's prediction")
    parser.add_argument("--figure", metavar="PATH",
                        help="save the measured 1F1B, ZB-H1, ZB-V timelines as a PNG")
    args = parser.parse_args()
    one_process_only("it starts its own world of pipeline stages to run each schedule")
    p, m, op_s = args.stages, args.microbatches, args.op_ms / 1e3
    if p < 2 or m < 1:
        parser.error(f"need at least 2 stages and 1 micro-batch, got -p {p} -m {m}")
    try:
        unequal = tuple(float(c) for c in args.unequal.split(","))
    except ValueError:
        unequal = ()
    if len(unequal) != 3 or min(unequal) <= 0:
        parser.error(f"--unequal takes three positive costs F,B,W, got {args.unequal!r}")

    cfg, idx, tgt, want = reference_gpt(2 * p, m)

    ok, measured, table = True, {}, []
    with World(p) as world:
        for name in SCHEDULES:
            v = chunks_per_rank(name)
            print(f"\n=== {name} (p = {p}, m = {m}" + (", two chunks per rank in a V)"
                                                      if name == "zb_v" else ")"))
            ideal = simulate(make_schedule(name, p, m), v, 1, 2, placement=placement(name))
            print("ideal (each of F, B, W one slot" + ("; B and W fused: two)" if name == "1f1b"
                                                      else ")") + ":")
            print(render_timeline(ideal, slot=1 / v))
            want_bubble = formula(name, p, m)
            # latency only ever adds idle time, so the least of a few runs is the best estimate
            for attempt in range(1, 4):
                results = world.run(timed, name, m, op_s)
                got = measured_bubble([t for t, _ in results])
                if want_bubble is None or got <= want_bubble + MARGIN:
                    break
            timelines = [t for t, _ in results]
            measured[name] = timelines
            print(f"measured in {p} processes, one cell = {1e3 * op_s / v:.0f} ms"
                  + (f" (run {attempt} of up to 3)" if attempt > 1 else "") + ":")
            print(render_timeline(timelines, slot=op_s / v))
            # wall-clock time on a shared machine is not a check; the ideal run is
            near = want_bubble is None or want_bubble - 0.02 <= got <= want_bubble + MARGIN
            exact = want_bubble is None or abs(measured_bubble(ideal) - want_bubble) < 1e-12
            ok &= exact
            shown = "-" if want_bubble is None else f"{want_bubble:.3f}"
            print(f"bubble (idle/compute): measured {got:.3f}"
                  f"{'' if near else ' (machine busy: latency adds idle)'}, ideal "
                  f"{measured_bubble(ideal):.3f}, formula {shown}")
            peaks = [k for _, k in results]
            grads, w_bytes = {}, []
            for part, held in world.run(gpt_grads, cfg, name, m, idx, tgt):
                grads.update(part)
                w_bytes.append(held)
            err = max(float(np.abs(grads[n] - want[n]).max()) for n in want)
            ok &= err <= TOLERANCE
            unit = "micro-batch chunks (half a stage each)" if v == 2 else "micro-batches"
            print(f"peak in flight per stage, F to W: {peaks} {unit}")
            if name != "1f1b":
                print(f"most bytes the GPT pieces' W closures kept alive, per rank: {w_bytes}")
            print(f"GPT in {p * v} pieces: max |pipeline - single| over gradients = {err:.1e}")
            table.append((name, got, measured_bubble(ideal), shown, max(peaks) / v))

        # Unequal costs: no closed formula, but the simulator predicts the bubble from
        # the same orders and costs; the processes should land on it (plus latency).
        f, b, w = unequal
        print(f"\n=== unequal costs T_F : T_B : T_W = {f:g} : {b:g} : {w:g} "
              f"(1F1B runs B and W fused, {b + w:g})")
        print(f"{'schedule':<9}{'measured':>10}{'simulated':>11}")
        for name in SCHEDULES:
            v = chunks_per_rank(name)
            predicted = measured_bubble(simulate(make_schedule(name, p, m), v, f, b + w, w,
                                                 placement=placement(name)))
            got = min(measured_bubble([t for t, _ in world.run(timed, name, m, op_s, unequal)])
                      for _ in range(2))       # the lesser of two runs, as above
            print(f"{name:<9}{got:>10.3f}{predicted:>11.3f}")

    print(f"\n{'schedule':<9}{'measured':>10}{'ideal':>8}{'formula':>9}"
          f"{'peak activations (stage 0 = p in 1F1B)':>42}")
    for name, got, ideal_b, shown, peak in table:
        print(f"{name:<9}{got:>10.3f}{ideal_b:>8.3f}{shown:>9}{peak:>42g}")

    if args.figure:
        from _figures import pipeline_timelines
        pipeline_timelines(args.figure, {n: measured[n] for n in DRAWN}, p)

    print(f"\ncheck: ideal bubbles equal the formulas, gradients within {TOLERANCE:.0e} of "
          f"one process  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
