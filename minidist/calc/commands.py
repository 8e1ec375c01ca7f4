"""``minidist calc TOPIC --flags``: the cost models on the command line.

    minidist calc zero --params 7e9 --gpus 64 --stage 2
    minidist calc allreduce --bytes 100e6 --gpus 8 --bandwidth 50e9 --latency 10e-6
    minidist calc bubble --stages 4 --microbatches 12 --schedule gpipe

Each topic is one entry of ``TOPICS``: its flags, the formula it prints in
``--help``, and a function from the parsed flags to the lines it prints. The
arithmetic itself lives in the other files of ``minidist.calc``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable

from minidist.calc import comm, compute, memory, pipeline, recipes, tensor


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.3f} ms"


@dataclass
class Topic:
    help: str                                   # one line, in `minidist calc --help`
    formula: str                                # shown by `minidist calc TOPIC --help`
    flags: list = field(default_factory=list)   # (flag, type, default, help); default None = required
    run: Callable[[argparse.Namespace], list[str]] = None


def _allreduce(a):
    rows = []
    for algo in ("ring", "tree", "naive"):
        cost = comm.all_reduce_cost(a.bytes, a.gpus, a.bandwidth, a.latency, algo)
        rows.append(f"{algo:>5}: time {_ms(cost.seconds)}, busiest rank sends {_gb(cost.bytes_per_rank)}, {cost.steps} steps")
    if a.node_size:                             # a two-level topology: compare with the ring
        if a.gpus % a.node_size:
            raise SystemExit(f"--node-size {a.node_size} must divide --gpus {a.gpus}")
        local, nodes = a.node_size, a.gpus // a.node_size
        inter = a.inter_bandwidth or a.bandwidth
        flat = comm.ring_all_reduce_time(a.bytes, a.gpus, min(a.bandwidth, inter), a.latency)
        hier = comm.hierarchical_all_reduce_time(a.bytes, nodes, local, a.bandwidth, inter,
                                                 a.latency)
        rows.append(f"{nodes} nodes x {local} ranks, {a.bandwidth / 1e9:g} GB/s inside, "
                    f"{inter / 1e9:g} GB/s between:")
        rows.append(f"  flat ring:    time {_ms(flat)}")
        rows.append(f"  hierarchical: time {_ms(hier)}, sends "
                    f"{_gb(comm.hierarchical_inter_node_bytes(a.bytes, nodes, local))} "
                    f"between nodes per rank ({flat / hier:.2f}x faster)")
    return rows


def _zero(a):
    stages = [a.stage] if a.stage is not None else [0, 1, 2, 3]
    names = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
    rows = []
    for s in stages:
        per_param = memory.model_state_bytes_per_param(a.gpus, s, a.precision)
        total = memory.zero_memory_per_gpu(a.params, a.gpus, s, a.precision)
        rows.append(f"{names[s]:>6}: {per_param:6.3f} bytes/param -> {_gb(total)} per GPU")
    return rows


def _bubble(a):
    f = pipeline.bubble_fraction(a.stages, a.microbatches, a.schedule, a.virtual_stages)
    peak = pipeline.peak_inflight_microbatches(a.stages, a.microbatches,
                                               "gpipe" if a.schedule == "gpipe" else "1f1b")
    return [f"bubble fraction ({a.schedule}): {f:.4f} = {100 * f:.2f}%",
            f"peak in-flight micro-batches on stage 0: {peak}"]


def _flops(a):
    c = compute.training_flops(a.params, a.tokens)
    rows = [f"training FLOPs C = 6PD = {c:.3e} ({compute.petaflop_days(c):,.1f} petaFLOP-days)"]
    if a.gpus and a.peak_tflops and a.mfu:
        secs = compute.training_seconds(c, a.gpus, a.peak_tflops * 1e12, a.mfu)
        hours = compute.gpu_hours(c, a.peak_tflops * 1e12, a.mfu)
        rows.append(f"wall clock on {a.gpus} GPUs: {secs / 86400:,.1f} days; {hours:,.0f} GPU-hours")
        if a.price:
            rows.append(f"on-demand cost: ${compute.on_demand_cost(hours, a.price):,.0f}")
    return rows


def _activations(a):
    full = memory.activation_memory(a.batch, a.seq, a.hidden, a.layers, a.bytes_per_element)
    interval = a.interval or memory.sqrt_checkpoint_interval(a.layers)
    frac = memory.checkpoint_peak_fraction(a.layers, interval)
    return [f"activations without checkpointing: {_gb(full)}",
            f"with a checkpoint every {interval} layers: {_gb(full * frac)} ({100 * frac:.1f}%)"]


def _checkpoint(a):
    size = memory.checkpoint_bytes(a.params, a.precision)
    rows = [f"checkpoint size: {_gb(size)}"]
    if a.write_bw:
        secs = memory.checkpoint_write_seconds(size, a.write_bw, a.writers)
        rows.append(f"write time: {secs:,.1f} s")
        if a.mtbf_hours:
            tau = recipes.young_interval(secs, a.mtbf_hours * 3600)
            rows.append(f"Young's interval sqrt(2 C F): {tau / 60:,.1f} min")
    return rows


def _tp(a):
    col = tensor.column_parallel_shard(a.hidden, 4 * a.hidden, a.tp)
    row = tensor.row_parallel_shard(4 * a.hidden, a.hidden, a.tp)
    per = tensor.tp_all_reduce_bytes(a.batch, a.seq, a.hidden, a.tp)
    layer = tensor.tp_comm_bytes_per_layer(a.batch, a.seq, a.hidden, a.tp)
    return [f"MLP shards per rank: W1 {col}, W2 {row}",
            f"one all-reduce of [b*s, d]: each rank sends {_gb(per)}",
            f"per layer forward (2 all-reduces): {_gb(layer)}"]


def _lr(a):
    return [f"linear scaling: {recipes.linear_scaled_lr(a.base_lr, a.base_batch, a.new_batch):.4g}",
            f"sqrt scaling:   {recipes.sqrt_scaled_lr(a.base_lr, a.base_batch, a.new_batch):.4g}",
            f"warmup steps (heuristic): {recipes.warmup_steps(a.base_batch, a.new_batch)}"]


def _roofline(a):
    ridge = compute.ridge_point(a.peak_tflops * 1e12, a.bandwidth)
    rows = [f"ridge point: {ridge:,.1f} FLOP/byte"]
    if a.m:
        i = compute.matmul_intensity(a.m, a.n or a.m, a.k or a.m, a.bytes_per_element)
        bound = "compute" if i >= ridge else "memory"
        rows.append(f"matmul {a.m}x{a.k or a.m} @ {a.k or a.m}x{a.n or a.m}: "
                    f"{i:,.1f} FLOP/byte -> {bound}-bound")
    return rows


def _batch(a):
    k = recipes.accumulation_steps(a.target, a.micro, a.dp)
    return [f"accumulation steps: {k}",
            f"effective batch: {recipes.effective_batch(a.micro, k, a.dp)}"]


TOPICS: dict[str, Topic] = {
    "allreduce": Topic(
        "time and bytes of ring / tree / naive all-reduce",
        "T_ring = 2(N-1) alpha + 2(N-1)/N * M/beta;  T_tree = 2 ceil(log2 N) (alpha + M/beta);"
        "  T_naive = 2(N-1) (alpha + M/beta)",
        [("--bytes", float, None, "message size M in bytes"), ("--gpus", int, None, "ranks N"),
         ("--bandwidth", float, None, "beta in bytes/s"), ("--latency", float, 0.0, "alpha in s"),
         ("--node-size", int, 0, "ranks per node L: also compare hierarchical with the ring"),
         ("--inter-bandwidth", float, 0.0, "beta between nodes in bytes/s (with --node-size)")],
        _allreduce),
    "zero": Topic(
        "model-state memory per GPU for DDP and ZeRO stages",
        "mixed-precision Adam: DDP 16, ZeRO-1 4 + 12/N, ZeRO-2 2 + 14/N, ZeRO-3 16/N bytes/param",
        [("--params", float, None, "parameters P"), ("--gpus", int, None, "data-parallel ranks N"),
         ("--stage", int, "", "0..3 (default: all)"), ("--precision", str, "mixed", "mixed | fp32")],
        _zero),
    "bubble": Topic(
        "pipeline bubble fraction and in-flight micro-batches",
        "GPipe (p-1)/(m+p-1);  1F1B (p-1)/m;  interleaved (p-1)/(m v)",
        [("--stages", int, None, "p"), ("--microbatches", int, None, "m"),
         ("--schedule", str, "1f1b", "gpipe | 1f1b | interleaved"),
         ("--virtual-stages", int, 1, "v (interleaved)")],
        _bubble),
    "flops": Topic(
        "training compute, time and cost",
        "C = 6 P D;  time = C / (gpus * peak * MFU);  GPU-hours = C / (peak * MFU) / 3600",
        [("--params", float, None, "P"), ("--tokens", float, None, "D"), ("--gpus", int, 0, ""),
         ("--peak-tflops", float, 0.0, "per GPU"), ("--mfu", float, 0.0, "0..1"),
         ("--price", float, 0.0, "$ per GPU-hour")],
        _flops),
    "activations": Topic(
        "activation memory with and without checkpointing",
        "tensors_per_layer * b * s * d * bytes per layer, times L; checkpointing every k ~ sqrt(L)",
        [("--batch", int, None, "b"), ("--seq", int, None, "s"), ("--hidden", int, None, "d"),
         ("--layers", int, None, "L"), ("--bytes-per-element", float, 2.0, "2 fp16, 1 fp8"),
         ("--interval", int, 0, "checkpoint interval k (default sqrt(L))")],
        _activations),
    "checkpoint": Topic(
        "checkpoint size, write time and Young's interval",
        "size = bytes/param * P;  t = size / (bandwidth * writers);  tau = sqrt(2 C F)",
        [("--params", float, None, "P"), ("--precision", str, "mixed", "mixed | fp32"),
         ("--write-bw", float, 0.0, "bytes/s per writer"), ("--writers", int, 1, ""),
         ("--mtbf-hours", float, 0.0, "mean time between failures F")],
        _checkpoint),
    "tp": Topic(
        "tensor-parallel shard shapes and all-reduce volume",
        "column W1 [d, 4d/t], row W2 [4d/t, d]; each all-reduce of [b*s, d] sends 2(t-1)/t * b*s*d*bytes",
        [("--hidden", int, None, "d"), ("--seq", int, None, "s"), ("--batch", int, None, "b"),
         ("--tp", int, None, "t")],
        _tp),
    "lr": Topic(
        "learning-rate scaling rules and warmup",
        "linear: lr * B_new/B_base;  sqrt: lr * sqrt(B_new/B_base);  warmup = (B_new/B_base) * 1000",
        [("--base-lr", float, None, ""), ("--base-batch", int, None, ""),
         ("--new-batch", int, None, "")],
        _lr),
    "roofline": Topic(
        "ridge point and whether a matmul is compute- or memory-bound",
        "ridge = peak FLOP/s / bandwidth;  matmul intensity = 2MNK / (bytes (MK + KN + MN))",
        [("--peak-tflops", float, None, ""), ("--bandwidth", float, None, "bytes/s"),
         ("--m", int, 0, ""), ("--n", int, 0, ""), ("--k", int, 0, ""),
         ("--bytes-per-element", float, 2.0, "")],
        _roofline),
    "batch": Topic(
        "gradient accumulation steps for a target batch",
        "B_eff = micro_batch * accumulation_steps * DP",
        [("--target", int, None, "target global batch"), ("--micro", int, None, "per-GPU micro-batch"),
         ("--dp", int, None, "data-parallel ranks")],
        _batch),
}


def add_calc_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Wire ``minidist calc`` into the command line; returns its runner."""
    topics = parser.add_subparsers(dest="topic", required=True, metavar="TOPIC")
    for name, topic in TOPICS.items():
        p = topics.add_parser(name, help=topic.help, description=f"{topic.help}.\n\nformula: "
                              f"{topic.formula}", formatter_class=argparse.RawDescriptionHelpFormatter)
        for flag, kind, default, text in topic.flags:
            if default is None:
                p.add_argument(flag, type=kind, required=True, help=text)
            elif default == "":
                p.add_argument(flag, type=kind, default=None, help=text)
            else:
                p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")

    def run(ns: argparse.Namespace) -> int:
        topic = TOPICS[ns.topic]
        print(f"{ns.topic}: {topic.formula}")
        for line in topic.run(ns):
            print("  " + line)
        return 0
    return run
