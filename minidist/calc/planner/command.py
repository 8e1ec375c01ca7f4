"""``minidist plan``: which layout for this model on these GPUs?

    minidist plan --model llama3-70b --cluster h100-nvlink-ib --gpus 1024 \\
                  --batch-tokens 4194304 --seq 8192
    minidist plan --model llama3-8b --gpus 64 --explain "dp8 tp8 pp1 z1 b1 none"
    minidist plan --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 \\
                  --vocab 128256 --gpus 64 --figure plan.png
    minidist plan --measure              # predicted beside measured, a small GPT run here

A bad number, an unknown preset, or a problem no layout can split (a batch too small
for the data-parallel degree the GPUs need) is a usage error (exit 2); a search whose
layouts all run out of memory names the nearest miss and what it lacks (exit 1).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any, Callable

from minidist.calc.cli_args import non_negative, positive, positive_int
from minidist.calc.planner import layouts, machine, presets, report
from minidist.calc.planner.search import plan, score

LINK_ENV, INTER_ENV, NODE_ENV = ("MINIDIST_LINK_GBPS", "MINIDIST_INTER_NODE_GBPS",
                                 "MINIDIST_NODE_SIZE")     # comm/transport/link.py's
DEFAULT_LINK_GBPS = {"--link-gbps": 0.5, "--inter-node-gbps": 0.5}
SIZES = (("--layers", "layers"), ("--hidden", "hidden"), ("--heads", "heads"),
         ("--kv-heads", "kv_heads"), ("--ffn", "ffn_hidden"), ("--vocab", "vocab"),
         ("--experts", "experts"), ("--top-k", "top_k"))
CLUSTER = (("--gpus-per-node", "gpus_per_node", positive_int),
           ("--memory", "memory", positive), ("--peak-flops", "peak_flops", positive),
           ("--intra-bandwidth", "intra_bandwidth", positive),
           ("--inter-bandwidth", "inter_bandwidth", positive),
           ("--intra-latency", "intra_latency", non_negative),
           ("--inter-latency", "inter_latency", non_negative),
           ("--efficiency", "matmul_efficiency", positive))


def add_arguments(parser: argparse.ArgumentParser,
                  runner: Callable[[], Any] | None = None) -> Callable[[argparse.Namespace], int]:
    """``runner``: returns minidist.parallel.compare.measure (the command line passes it, so that
    calc imports nothing of the package); without it --measure is a usage error."""
    parser.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
    parser.usage = ("minidist plan [--model NAME] [--cluster NAME] [--gpus N] "
                    "[--batch-tokens N] [--seq N] [--explain LAYOUT] [--figure PNG] [...]")
    parser.epilog = "model presets: " + ", ".join(sorted(presets.MODELS)) + \
        ".  cluster presets: " + ", ".join(sorted(presets.CLUSTERS))
    parser.add_argument("--model", default="llama3-8b", help="a model preset, or 'custom' "
                        "with the size flags (default llama3-8b); size flags override a preset")
    for flag, field in SIZES:
        parser.add_argument(flag, dest=field, type=positive_int, default=None)
    parser.add_argument("--cluster", default="h100-nvlink-ib",
                        help="a cluster preset (default h100-nvlink-ib); the flags below "
                        "override its fields (SI units: bytes, bytes/s, FLOP/s, seconds)")
    for flag, field, kind in CLUSTER:
        parser.add_argument(flag, dest=field, type=kind, default=None)
    parser.add_argument("--gpus", type=positive_int, default=64, help="GPUs (default 64)")
    parser.add_argument("--batch-tokens", type=positive_int, default=None,
                        help="global batch in tokens (default 4Mi; --measure: 8 sequences)")
    parser.add_argument("--seq", type=positive_int, default=None,
                        help="sequence length (default 8192; --measure: 128)")
    parser.add_argument("--precision", choices=("mixed", "fp32"), default="mixed")
    parser.add_argument("--max-micro-batch", type=positive_int, default=8)
    parser.add_argument("--top", type=positive_int, default=10, help="layouts shown")
    parser.add_argument("--explain", metavar="LAYOUT",
                        help="explain one layout, e.g. 'dp8 tp8 pp1 cp1 z1 b1 none'")
    parser.add_argument("--published", action="store_true",
                        help="score the layouts published for Megatron's GPTs and Llama 3 "
                        "405B beside the planner's own choice")
    parser.add_argument("--figure", metavar="PNG",
                        help="draw memory against step time for the whole space")
    _add_measure_arguments(parser)
    return lambda ns: run(ns, parser, runner)


def _add_measure_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``plan --measure``: runs of a small GPT on this machine."""
    group = parser.add_argument_group(
        "--measure", "run layouts of a small GPT here and print predicted beside measured "
        "(size flags override its 4 layers, hidden 128, 4 heads, vocabulary 512; "
        "--memory limits this machine's memory per rank, in bytes)")
    group.add_argument("--measure", action="store_true",
                       help="calibrate this machine, predict, run, compare")
    group.add_argument("--ranks", type=positive_int, default=2,
                       help="processes, one per core as GPUs (default 2)")
    group.add_argument("--steps", type=positive_int, default=3,
                       help="timed steps per layout and round (default 3)")
    group.add_argument("--rounds", type=positive_int, default=3,
                       help="times every layout is run, in turn (default 3)")
    for flag, env, text in (("--link-gbps", LINK_ENV, "inside a node"),
                            ("--inter-node-gbps", INTER_ENV, "between nodes")):
        group.add_argument(flag, type=non_negative, default=None,
                           help=f"the emulated link {text}, GB/s (default ${env}, else "
                           f"{DEFAULT_LINK_GBPS[flag]})")
    group.add_argument("--node-size", type=positive_int, default=None,
                       help=f"ranks per node (default ${NODE_ENV}, else all in one)")


def _inputs(ns: argparse.Namespace, parser: argparse.ArgumentParser):
    try:
        if ns.model == "custom":
            missing = [flag for flag, field in SIZES[:6] if getattr(ns, field) is None]
            if missing:
                parser.error(f"--model custom needs {', '.join(missing)}")
            spec = presets.ModelSpec("custom", *(getattr(ns, f) for _, f in SIZES[:6]))
        else:
            spec = presets.model_preset(ns.model)
        sizes = {field: getattr(ns, field) for _, field in SIZES
                 if getattr(ns, field) is not None}
        spec = dataclasses.replace(spec, **sizes)
        if spec.hidden % spec.heads or spec.heads % spec.kv_heads:
            parser.error(f"--heads {spec.heads} must divide --hidden {spec.hidden} and be a "
                         f"multiple of --kv-heads {spec.kv_heads}")
        if spec.top_k > spec.experts:
            parser.error(f"--top-k {spec.top_k} is more than --experts {spec.experts}")
        overrides = {field: getattr(ns, field) for _, field, _ in CLUSTER
                     if getattr(ns, field) is not None}
        cluster = presets.cluster_preset(ns.cluster, **overrides)
    except ValueError as error:
        parser.error(str(error))
    if ns.batch_tokens % ns.seq:
        parser.error(f"--batch-tokens {ns.batch_tokens} is not a whole number of "
                     f"--seq {ns.seq} sequences")
    return spec, cluster, presets.TrainingSetup(ns.batch_tokens, ns.seq, ns.precision)


def _env_number(name: str, kind: type, parser: argparse.ArgumentParser):
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if value < 0:
        parser.error(f"{name}={text!r} is not a number >= 0")
    return value


def _measure(ns: argparse.Namespace, parser: argparse.ArgumentParser, runner) -> int:
    if runner is None:
        parser.error("--measure needs the runs: use `minidist plan --measure`")
    seq = ns.seq or 128
    base = machine.scaled_gpt(seq=seq)
    sizes = {field: getattr(ns, field) for _, field in SIZES[:6] if getattr(ns, field)}
    if "heads" in sizes:
        sizes.setdefault("kv_heads", sizes["heads"])
    if "hidden" in sizes:
        sizes["ffn_hidden"] = 4 * sizes["hidden"]
    spec = dataclasses.replace(base, **sizes)
    if spec.hidden % spec.heads or spec.kv_heads != spec.heads:
        parser.error(f"--measure runs a GPT: --heads {spec.heads} must divide --hidden "
                     f"{spec.hidden}, with as many KV heads")
    tokens = ns.batch_tokens or 8 * seq
    if tokens % seq or (tokens // seq) % ns.ranks:
        parser.error(f"--batch-tokens {tokens} must be a whole number of --seq {seq} "
                     f"sequences that divides over --ranks {ns.ranks}")
    gbps = [getattr(ns, attr) if getattr(ns, attr) is not None else
            _env_number(env, float, parser) for attr, env in
            (("link_gbps", LINK_ENV), ("inter_node_gbps", INTER_ENV))]
    gbps = [g if g is not None else d for g, d in zip(gbps, DEFAULT_LINK_GBPS.values())]
    node = ns.node_size or _env_number(NODE_ENV, int, parser) or ns.ranks
    if ns.ranks % node:
        parser.error(f"--node-size {node} must divide --ranks {ns.ranks}")
    setup = presets.TrainingSetup(tokens, seq, "fp32")
    print(f"{spec.name}: {spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads, "
          f"vocabulary {spec.vocab}; {setup.sequences} sequences of {seq} tokens per step, "
          f"float32, AdamW; {ns.ranks} ranks in nodes of {node}, link {gbps[0]:g} GB/s "
          f"inside a node, {gbps[1]:g} GB/s between nodes")
    measure = runner()
    with measure.Bench(ns.ranks, link_gbps=gbps[0], node_size=node,
                       inter_node_gbps=gbps[1], steps=ns.steps) as bench:
        cluster, rows = machine.measure(
            bench, spec, setup, ns.ranks, link_bytes=gbps[0] * 1e9,
            inter_bytes=gbps[1] * 1e9, node_size=node, max_micro_batch=ns.max_micro_batch,
            rounds=ns.rounds, memory=ns.memory or machine.UNLIMITED, log=print)
    print()
    print("\n".join(machine.table(rows, memory_limit=ns.memory)))
    return 0


def run(ns: argparse.Namespace, parser: argparse.ArgumentParser, runner=None) -> int:
    if ns.measure:
        return _measure(ns, parser, runner)
    ns.seq = ns.seq or 8192
    ns.batch_tokens = ns.batch_tokens or 4 * 2**20
    if ns.published:
        from minidist.calc.planner.published import PUBLISHED, compare
        print("\n".join(report.published([compare(entry) for entry in PUBLISHED])))
        return 0
    spec, cluster, setup = _inputs(ns, parser)
    if ns.explain:
        try:
            layout = layouts.parse_layout(ns.explain)
        except (ValueError, TypeError) as error:
            parser.error(f"--explain: {error}")
        print("\n".join(report.explain(score(spec, setup, layout, cluster, ns.gpus),
                                       spec.name)))
        return 0
    start = time.perf_counter()
    result = plan(spec, cluster, ns.gpus, setup, top=ns.top,
                  max_micro_batch=ns.max_micro_batch, keep_points=bool(ns.figure))
    seconds = time.perf_counter() - start
    if not result.best and result.nearest is None:     # nothing passes even the rules
        parser.error(report.nearest_miss(result)[0])
    print("\n".join(report.wrapped(
        f"{spec.name} on {ns.gpus} GPUs of {cluster.name} ({cluster.gpus_per_node} per node, "
        f"{cluster.memory / 1e9:g} GB), {setup.sequences} sequences of {setup.seq} tokens "
        f"per step; searched in {seconds:.1f} s", "  ")))
    if not result.best:
        print("\n".join(report.nearest_miss(result)))
        print("\n".join(report.exclusions(result)))
        return 1
    print("\n".join(report.table(result, ns.top)))
    print("\n".join(report.exclusions(result)))
    print()
    print("\n".join(report.explain(result.best[0], "the best")))
    if ns.figure:
        from minidist.calc.planner.figure import draw
        draw(result, ns.figure)
        print(f"figure: {ns.figure}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minidist plan")
    return add_arguments(parser)(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
