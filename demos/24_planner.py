"""Demo 24: which layout for this model on these GPUs? The planner, its answer explained,
and its model held against layouts that real runs published.

    (a) Llama 3 70B on 1024 H100s (8 per node, 80 GB), 4M tokens of 8192 per step:
        every dp x tp x pp x cp layout with every ZeRO stage, micro-batch,
        recomputation and schedule is priced (minidist.calc.planner); the five
        fastest are printed with their time and memory by part, the best explained
        term by term, and the whole space drawn as memory against step time;
    (b) Megatron's GPTs (Narayanan et al. 2021, Table 1) and Llama 3 405B (the Llama 3
        report, Table 4): the published layout under the planner's cost model beside
        what its authors measured, and the planner's own choice.

    (c) with --measure: ``minidist plan --measure``: a small GPT on this machine's
        cores, the cost model calibrated here (a matmul, two steps of the model
        alone, the emulated link), the predicted best layouts and some worse ones run
        with minidist's own DDP, ZeRO, tensor and pipeline parallelism, and predicted
        beside measured step time and peak memory per rank (about a minute).

The check: every published layout fits in memory, its predicted utilization is within
6 points of the reported one, and the planner's best is at most 1.5x faster. (c) prints
how many rows meet the targets (10% memory, 25% time, the top five's order); it is a
measurement on a shared machine, not a check.

    python demos/24_planner.py                    # ~30 s on 2 cores
    python demos/24_planner.py --gpus 256 --model llama3-8b --no-published
    python demos/24_planner.py --measure          # (c) too: ~1-2 min on 2 cores
"""
import argparse
import sys
import time

from minidist.calc.planner import TrainingSetup, cluster_preset, model_preset, plan, report
from minidist.calc.planner.published import PUBLISHED, compare
from minidist.cli import main as cli_main
from _args import or_usage_error, positive_int

UTILIZATION_GAP = 0.06
SPEED_FACTOR = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--cluster", default="h100-nvlink-ib")
    parser.add_argument("--gpus", type=positive_int, default=1024)
    parser.add_argument("--batch-tokens", type=positive_int, default=4 * 2**20)
    parser.add_argument("--seq", type=positive_int, default=8192)
    parser.add_argument("--figure", help="save memory against step time for every layout")
    parser.add_argument("--no-published", action="store_true",
                        help="skip (b); the check is then that a layout fits")
    parser.add_argument("--measure", action="store_true",
                        help="(c): run layouts here, predicted beside measured")
    args = parser.parse_args()
    spec = or_usage_error(parser, model_preset, args.model)
    cluster = or_usage_error(parser, cluster_preset, args.cluster)
    setup = or_usage_error(parser, TrainingSetup, args.batch_tokens, args.seq)

    start = time.perf_counter()
    result = or_usage_error(parser, plan, spec, cluster, args.gpus, setup, top=5,
                            keep_points=bool(args.figure))
    print(f"(a) {spec.name} on {args.gpus} GPUs of {cluster.name}, {setup.sequences} "
          f"sequences of {setup.seq} tokens: searched in {time.perf_counter() - start:.1f} s\n")
    if not result.best:
        print("\n".join(report.nearest_miss(result)))
    else:
        print("\n".join(report.table(result, 5)))
        print()
        print("\n".join(report.exclusions(result)))
        print()
        print("\n".join(report.explain(result.best[0], "the best")))
        if args.figure:
            from minidist.calc.planner.figure import draw
            draw(result, args.figure)

    if args.measure:
        print("\n(c) minidist plan --measure: predicted beside measured, on this machine\n")
        if cli_main(["plan", "--measure"]) != 0:
            return 1
    if args.no_published:
        print(f"\ncheck: a layout fits: {bool(result.best)}  {'OK' if result.best else 'FAILED'}")
        return 0 if result.best else 1
    print("\n(b) published layouts under the same cost model\n")
    comparisons = [compare(entry) for entry in PUBLISHED]
    print("\n".join(report.published(comparisons)))
    gap = max(abs(c.predicted - c.entry.utilization) for c in comparisons)
    factor = max(c.speed_ratio for c in comparisons)
    fits = all(c.published.feasible for c in comparisons)
    ok = fits and gap <= UTILIZATION_GAP and factor <= SPEED_FACTOR
    print(f"\ncheck: every published layout fits: {fits}; max |predicted - reported| = {gap:.1%} "
          f"(tolerance {UTILIZATION_GAP:.0%}); planner's best at most {factor:.2f}x faster "
          f"(tolerance {SPEED_FACTOR}x)  {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
