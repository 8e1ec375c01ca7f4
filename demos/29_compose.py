"""Demo 29: one model, one mesh, every dimension, and where it parts from one process.

Eight ranks train a small MoE Llama (4 experts a layer, top 2, its balancing loss) on the
shipped corpus under one composed layout, by default each dimension 2 where it applies:
pp=2 x dp_shard=2 x tp=2, with ep=2 borrowed from dp_shard (parallelize_llama, torchtitan's
order: tp, cp, ep, the pipeline, FSDP; docs/3d_parallel.md, "Every dimension on one mesh").
It shows

    1. which ranks hold which block of one weight (visualize_sharding)
    2. each step's loss beside one process's, their distance in ulps, and the first tensor
       where the runs part, if any (minidist compare, float64)
    3. the bytes each rank sent per mesh dimension, read off a trace of the run whose
       every call is labelled with its dimension (trace summary)

and checks that no gradient or parameter parts from one process's past the tolerance.

    python demos/29_compose.py                                 # ~10 s on 2 cores
    python demos/29_compose.py --layout "dp_shard=2 cp=2 tp=2 ep=2" --show model.norm.weight
"""
import argparse
import os
import sys
import tempfile

from _args import positive_int
from _launched import one_process_only

WEIGHT = "model.layers.0.self_attn.q_proj.weight"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layout", default="pp=2 dp_shard=2 tp=2 ep=2",
                   help="torchtitan's degrees, as minidist compare reads them")
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--batch", type=positive_int, default=4, help="global batch rows")
    p.add_argument("--block", type=positive_int, default=8, help="characters per row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", default=WEIGHT, help="the weight whose blocks are drawn")
    args = p.parse_args(argv)
    from minidist.parallel.compare import LayoutError, parse_layout
    from minidist.parallel.compare.command import (CORPUS, check_model_layout,
                                                   corpus_batches, refuse_other_microbatches)
    from minidist.parallel.compare.run import RunSpec
    try:
        layout = parse_layout(args.layout)
        rows = layout.dp_replicate * layout.dp_shard * layout.microbatches
        if args.batch % rows:
            p.error(f"--batch {args.batch} does not split into {rows} equal pieces")
        vocab, batches = corpus_batches(str(CORPUS), args.steps, args.batch, args.block,
                                        args.seed)
        spec = RunSpec(batches, vocab, "moe_llama", "float64", args.seed)
        check_model_layout(spec, layout, args.layout)
        refuse_other_microbatches(spec, layout, parse_layout("single"))
    except LayoutError as e:
        p.error(str(e))
    return args, layout, spec


def main(argv=None):
    one_process_only("it starts a world for the layout and trains one process beside it")
    args, layout, spec = parse_args(argv)
    from minidist import trace
    from minidist.parallel.compare import compare, parse_layout
    from minidist.parallel.compare.api import show_sharding
    from minidist.parallel.compare.command import print_report
    from minidist.trace.summary import summarize
    print(f"MoE Llama (4 experts, top 2), {spec.batches[0][0].shape} tokens a step, float64; "
          f"{layout.world_size} ranks: {layout}\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        with trace.record(path):
            print(show_sharding(spec, layout, args.show) + "\n")
            report = compare(spec, layout, parse_layout("single"))
        sent = summarize(trace.load(path))["bytes_by_mesh_dim"]
    print_report(report)
    print(f"\nbytes sent per rank over {args.steps} steps, by mesh dimension (mean, max):")
    for dim, per_rank in sorted(sent.items()):
        values = list(per_rank.values())
        print(f"  {dim:<12} {sum(values) / len(values):>10,.0f} {max(values):>10,}")
    worst = max(line.ulps for line in report.steps)
    ok = report.parting is None
    print(f"check: every gradient and parameter within 1e-9 + 1e-6 |single| of one process "
          f"for {args.steps} steps, losses within {worst} ulps: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
