"""Demo 20: seeing a run: a trace of every rank of a 3D-parallel GPT step, and its summary.

A small GPT trains on a dp x pp x tp device mesh (default 2 x 2 x 2, 8
processes) inside ``minidist.trace.record``: every rank records its collectives
and messages (with an arrow from each send to its receive), the forward of
every module by name, each pipeline op and the optimizer step, and the ranks'
files are merged into one JSON that ui.perfetto.dev and chrome://tracing open.

The demo prints ``minidist trace summary`` of it (busy, idle and exposed
communication per rank, the pipeline bubble) and checks two things: the file
follows the Trace Event format (trace/check.py), and the bubble read off the
trace equals ``measured_bubble`` of the executor's own timeline of the same run.

    python demos/20_trace.py                          # 8 processes, ~15 s
    python demos/20_trace.py --dp 1 --pp 2 --tp 2 --out /tmp/run.json.gz
    python demos/20_trace.py --figure /tmp/trace.png  # also draw it (minidist trace plot)

Then: ``minidist trace summary /tmp/minidist_trace.json``, or drag the file into
ui.perfetto.dev. Code: minidist/trace/ (recorder, merge, summary, plot).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

from minidist import trace
from minidist.backend import from_host
from minidist.comm import DeviceMesh, World
from minidist.nn import GPTConfig
from minidist.optim import SGD
from minidist.parallel import ThreeDParallelGPT, measured_bubble
from minidist.trace.check import check
from minidist.trace.summary import render, summarize
from _args import positive_int
from _launched import one_process_only


def on_rank(cfg, shape, microbatches, batches):
    mesh = DeviceMesh(**shape)
    model = ThreeDParallelGPT(cfg, mesh, microbatches, "1f1b")
    opt = SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        model.train_step(from_host(x), from_host(y), opt)
    timeline = [(op.kind, start, end) for op, start, end in model.last_stats.timeline]
    return mesh.coord, mesh.ranks("pp"), timeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dp", type=positive_int, default=2)
    parser.add_argument("--pp", type=positive_int, default=2)
    parser.add_argument("--tp", type=positive_int, default=2)
    parser.add_argument("--microbatches", type=positive_int, default=4)
    parser.add_argument("--steps", type=positive_int, default=2)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "minidist_trace.json"),
                        help="the trace file (.gz: gzipped; default %(default)s)")
    parser.add_argument("--figure", metavar="PATH", help="save the timeline as a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts its own world and records that world's trace itself")
    if 32 % args.tp:
        parser.error(f"--tp ({args.tp}) must divide the vocabulary (32): each rank holds a slice")
    shape = dict(dp=args.dp, pp=args.pp, tp=args.tp)
    cfg = GPTConfig(block_size=16, vocab_size=32, n_layer=2 * args.pp, n_head=2 * args.tp,
                    n_embd=16 * args.tp, dtype="float32")
    rows = args.dp * args.microbatches * 2
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, cfg.vocab_size, (rows, cfg.block_size)),
                rng.integers(0, cfg.vocab_size, (rows, cfg.block_size)))
               for _ in range(args.steps)]
    print(f"GPT: {cfg.n_layer} layers, C = {cfg.n_embd}, on a mesh {shape}; "
          f"{args.steps} steps of {args.microbatches} micro-batches, traced into {args.out}\n")

    with trace.record(args.out):
        with World(args.dp * args.pp * args.tp) as world:
            results = world.run(on_rank, cfg, shape, args.microbatches, batches)

    merged = trace.load(args.out)
    summary = summarize(merged)
    print(render(summary))
    if args.figure:
        from minidist.trace.plot import plot
        last = [e for e in merged["traceEvents"] if e.get("cat") == "pipeline"
                and e["args"]["step"] == args.steps - 1]      # the last step's window
        start = min(e["ts"] for e in last) / 1e3 - 5
        end = max(e["ts"] + e["dur"] for e in last) / 1e3 + 5
        dims = " x ".join(f"{d} {n}" for d, n in shape.items())
        plot(merged, args.figure, start, end, title=f"one step of a 3D-parallel GPT ({dims}): "
             "every rank on one clock; grey lines are messages")
        print(f"\nfigure: {args.figure}")

    problems = check(merged)
    # the last step's bubble of each pipeline, from the executor's timeline and from the trace
    gap = 0.0
    for pp_ranks in {tuple(r[1]) for r in results}:
        own = measured_bubble([results[rank][2] for rank in pp_ranks])
        traced = summary["bubbles"][(pp_ranks, args.steps - 1)]
        gap = max(gap, abs(own - traced))
    n = len(merged["traceEvents"])
    print(f"\nopen it: drag {args.out} into ui.perfetto.dev (or chrome://tracing); "
          f"`minidist trace plot {args.out} trace.png` draws it")
    ok = not problems and gap < 1e-6
    print(f"check: {n} events, {len(problems)} format problems; "
          f"max |trace bubble - measured_bubble| = {gap:.1e}  (tolerance 1e-6)  "
          f"{'ok' if ok else 'FAILED'}")
    for line in problems[:5]:
        print("  " + line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
