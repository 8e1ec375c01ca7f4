"""``minidist calc TOPIC --flags``: the cost models on the command line.

    minidist calc zero --params 7e9 --gpus 64 --stage 2
    minidist calc allreduce --bytes 100e6 --gpus 8 --bandwidth 50e9 --latency 10e-6
    minidist calc bubble --stages 4 --microbatches 12
    minidist calc activations --batch 1 --seq 2048 --hidden 12288 --heads 96 --layers 96

Each topic is one entry of ``TOPICS``: its flags (each with the check its value
must pass, see cli_args), the formula and source shown by --help, and a function
from the parsed flags to the lines it prints. The arithmetic itself lives in
the other files of ``minidist.calc``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from minidist.calc import (activations, comm, compute, gpt, memory, model_commands,
                           pipeline, recipes, tensor)
from minidist.calc.cli_args import (Topic, add_topic_parser, fraction, non_negative,
                                    non_negative_int, positive, positive_int)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.3f} ms"


def _allreduce(a):
    rows = []
    for algo in ("ring", "tree", "naive"):
        cost = comm.all_reduce_cost(a.bytes, a.gpus, a.bandwidth, a.latency, algo)
        rows.append(f"{algo:>5}: time {_ms(cost.seconds)}, busiest rank sends "
                    f"{_gb(cost.bytes_per_rank)}, {cost.steps} steps")
    if a.node_size:                             # a two-level topology: compare with the ring
        if a.gpus % a.node_size:
            print(f"minidist calc allreduce: error: --node-size {a.node_size} must divide "
                  f"--gpus {a.gpus}", file=sys.stderr)
            raise SystemExit(2)
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
    chosen = [a.schedule] if a.schedule else ["gpipe", "1f1b"]
    if not a.schedule and a.virtual_stages > 1:
        chosen.append("interleaved")
    if not a.schedule:
        chosen += list(pipeline.ZERO_BUBBLE)
    rows = ["schedule      idle / useful compute   idle / whole step"]
    for name in chosen:
        v = a.virtual_stages if name == "interleaved" else 1
        try:
            bubble = pipeline.bubble_fraction(a.stages, a.microbatches, name, v)
            idle = pipeline.idle_fraction(a.stages, a.microbatches, name, v)
        except ValueError as e:     # a zero-bubble formula needs more micro-batches
            if a.schedule:
                print(f"minidist calc bubble: error: {e}", file=sys.stderr)
                raise SystemExit(2)
            rows.append(f"{name:<12}  (no formula at this m: {e})"[:100])
            continue
        rows.append(f"{name:<12}  {100 * bubble:20.2f}%  {100 * idle:17.2f}%")
    rows.append("GPipe and 1F1B idle for the same time; 1F1B holds fewer micro-batches:")
    for name in ("gpipe", "1f1b"):
        peak = pipeline.peak_inflight_microbatches(a.stages, a.microbatches, name)
        rows.append(f"  peak in-flight micro-batches on stage 0 ({name}): {peak}")
    return rows


def _flops(a):
    rows = []
    shape = (a.batch, a.seq, a.layers, a.hidden, a.vocab)
    if all(shape):
        with_ = gpt.training_flops_per_iteration(*shape, recompute=True)
        without = gpt.training_flops_per_iteration(*shape, recompute=False)
        chosen = with_ if a.recompute else without
        rows += [f"per iteration, with full recomputation: {with_:.4e} FLOPs",
                 f"per iteration, without recomputation:   {without:.4e} FLOPs",
                 f"this run ({'recomputes' if a.recompute else 'no recomputation'}): "
                 f"{chosen / (a.batch * a.seq):.4e} FLOPs per token"]
    elif any(shape):
        raise ValueError("FLOPs per iteration need all of --batch --seq --layers --hidden --vocab")
    if a.params and a.tokens:
        c = compute.training_flops(a.params, a.tokens)
        rows.append(f"training FLOPs C = 6PD = {c:.3e} ({compute.petaflop_days(c):,.1f} "
                    "petaFLOP-days)")
        if a.gpus and a.peak_tflops and a.mfu:
            secs = compute.training_seconds(c, a.gpus, a.peak_tflops * 1e12, a.mfu)
            hours = compute.gpu_hours(c, a.peak_tflops * 1e12, a.mfu)
            rows.append(f"wall clock on {a.gpus} GPUs: {secs / 86400:,.1f} days; "
                        f"{hours:,.0f} GPU-hours")
            if a.price:
                rows.append(f"on-demand cost: ${compute.on_demand_cost(hours, a.price):,.0f}")
    elif a.params or a.tokens:
        raise ValueError("C = 6PD needs both --params and --tokens")
    if not rows:
        raise ValueError("give --params and --tokens (C = 6PD), or --batch --seq --layers "
                         "--hidden --vocab (FLOPs per iteration)")
    return rows


def _params(a):
    layer = gpt.gpt_layer_params(a.hidden)
    total = gpt.gpt_params(a.layers, a.hidden, a.vocab, a.seq)
    return [f"per layer: 12h^2 + 13h = {layer:,}",
            f"embeddings: (V + s) h = {(a.vocab + a.seq) * a.hidden:,}",
            f"total P = {total:,} ({total / 1e9:,.2f} billion)"]


def _mfu(a):
    u = gpt.flops_utilization(a.batch, a.seq, a.layers, a.hidden, a.vocab, a.step_seconds,
                              a.gpus, a.peak_tflops * 1e12, a.recompute)
    tokens = a.batch * a.seq / a.step_seconds
    ran = ", recomputation included" if a.recompute else ""
    return [f"throughput: {tokens:,.0f} tokens/s",
            f"MFU (model FLOPs, no recomputation): {100 * u.mfu:.2f}%",
            f"HFU (FLOPs the hardware ran{ran}): {100 * u.hfu:.2f}%"]


def _activations(a):
    per_layer = activations.activation_memory_per_layer(
        a.seq, a.batch, a.hidden, a.heads, tp=a.tp, sequence_parallel=a.sp,
        recompute=a.recompute, flash=a.flash, bytes_per_element=a.bytes_per_element)
    setting = (f"tp={a.tp}{', sequence parallel' if a.sp else ''}, recompute={a.recompute}"
               f"{', flash attention' if a.flash else ''}")
    inputs = memory.layer_inputs_memory(a.batch, a.seq, a.hidden, a.layers, a.bytes_per_element)
    return [f"per layer ({setting}): {per_layer / 1e9:,.4f} GB",
            f"all {a.layers} layers: {_gb(a.layers * per_layer)}",
            f"the two sublayer inputs alone (the workbook's count): {_gb(inputs)}"]


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


PRECISIONS = ("mixed", "fp32")

TOPICS: dict[str, Topic] = {
    "allreduce": Topic(
        "time and bytes of ring / tree / naive all-reduce",
        "T_ring = 2(N-1) alpha + 2(N-1)/N * M/beta;  T_tree = 2 ceil(log2 N) (alpha + M/beta);"
        "  T_naive = 2(N-1) (alpha + M/beta)",
        "the alpha-beta model; workbook chapter 0 (ring 0.2, tree 0.4)",
        [("--bytes", positive, None, "message size M in bytes"),
         ("--gpus", positive_int, None, "ranks N"),
         ("--bandwidth", positive, None, "beta in bytes/s"),
         ("--latency", non_negative, 0.0, "alpha in s"),
         ("--node-size", non_negative_int, 0,
          "ranks per node L: also compare hierarchical with the ring"),
         ("--inter-bandwidth", non_negative, 0.0,
          "beta between nodes in bytes/s (with --node-size)")],
        _allreduce),
    "zero": Topic(
        "model-state memory per GPU for DDP and ZeRO stages",
        "mixed-precision Adam: DDP 16, ZeRO-1 4 + 12/N, ZeRO-2 2 + 14/N, ZeRO-3 16/N bytes/param",
        "Rajbhandari et al. 2020 (ZeRO), figure 1; workbook chapter 1",
        [("--params", positive, None, "parameters P"),
         ("--gpus", positive_int, None, "data-parallel ranks N"),
         ("--stage", (0, 1, 2, 3), "", "0 (DDP), 1, 2 or 3 (default: all)"),
         ("--precision", PRECISIONS, "mixed", "mixed | fp32")],
        _zero),
    "bubble": Topic(
        "pipeline bubble, as idle / useful compute and as idle / whole step",
        "idle / useful: GPipe and 1F1B (p-1)/m, interleaved (p-1)/(m v);"
        "  ZB-H1 (p-1)/(3m), ZB-H2 and ZB-V 0 (t_f = t_b = t_w);"
        "  idle / whole step: x / (1 + x) of it, (p-1)/(m v + p-1)",
        "Narayanan et al. 2021, section 2.2; Qi et al. 2024 (zero bubble), table 1;"
        " workbook chapter 5",
        [("--stages", positive_int, None, "p"), ("--microbatches", positive_int, None, "m"),
         ("--schedule", pipeline.SCHEDULES + pipeline.ZERO_BUBBLE, "",
          "gpipe | 1f1b | interleaved | zb_h1 | zb_h2 | zb_v (default: all)"),
         ("--virtual-stages", positive_int, 1, "v (interleaved)")],
        _bubble),
    "flops": Topic(
        "training FLOPs per iteration or for a whole run, time and cost",
        "per iteration 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recomputation,"
        " 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) without;  whole run C = 6 P D;"
        "  time = C / (gpus * peak * MFU)",
        "Narayanan et al. 2021, equation 3; Kaplan et al. 2020 for 6PD",
        [("--batch", positive_int, "", "B, sequences per iteration"),
         ("--seq", positive_int, "", "s"), ("--layers", positive_int, "", "l"),
         ("--hidden", positive_int, "", "h"), ("--vocab", positive_int, "", "V"),
         ("--recompute", bool, None, "the run recomputes activations in backward"),
         ("--params", positive, "", "P"), ("--tokens", positive, "", "D"),
         ("--gpus", non_negative_int, 0, ""), ("--peak-tflops", non_negative, 0.0, "per GPU"),
         ("--mfu", fraction, 0.0, "0..1"), ("--price", non_negative, 0.0, "$ per GPU-hour")],
        _flops),
    "params": Topic(
        "parameters of a GPT, biases, LayerNorms and embeddings included",
        "P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) = l (12h^2 + 13h) + (V + s) h",
        "Narayanan et al. 2021, equation 2",
        [("--layers", positive_int, None, "l"), ("--hidden", positive_int, None, "h"),
         ("--vocab", positive_int, None, "V"), ("--seq", positive_int, None, "s")],
        _params),
    "mfu": Topic(
        "model and hardware FLOPs utilization of a measured step",
        "MFU = model FLOPs (no recomputation) / (step time * gpus * peak);"
        "  HFU = the FLOPs that ran (recomputation included) / the same",
        "Chowdhery et al. 2022 (PaLM), appendix B, with Narayanan et al. 2021 equation 3",
        [("--batch", positive_int, None, "B, sequences per step"),
         ("--seq", positive_int, None, "s"), ("--layers", positive_int, None, "l"),
         ("--hidden", positive_int, None, "h"), ("--vocab", positive_int, None, "V"),
         ("--step-seconds", positive, None, "measured time of one step"),
         ("--gpus", positive_int, None, ""), ("--peak-tflops", positive, None, "per GPU"),
         ("--recompute", bool, None, "the run recomputes activations in backward")],
        _mfu),
    "activations": Topic(
        "activation memory per transformer layer",
        "s b h (34 + 5 a s / h) bytes per layer without parallelism;"
        " tensor parallel s b h (10 + 24/t + 5as/(ht)); with sequence parallel s b h (34/t + 5as/(ht));"
        " selective recomputation or flash attention drop the 5as/h term; full recomputation 2 s b h",
        "Korthikanti et al. 2022, equation 1 and table 2 (2-byte activations, 1-byte masks)",
        [("--batch", positive_int, None, "b"), ("--seq", positive_int, None, "s"),
         ("--hidden", positive_int, None, "h"), ("--heads", positive_int, None, "a"),
         ("--layers", positive_int, 1, "L"), ("--tp", positive_int, 1, "tensor-parallel size t"),
         ("--sp", bool, None, "sequence parallelism (splits the rest along s)"),
         ("--recompute", activations.RECOMPUTE, "none", "none | selective | full"),
         ("--flash", bool, None, "flash attention (keeps no attention scores)"),
         ("--bytes-per-element", positive, 2.0, "2 fp16/bf16, 1 fp8")],
        _activations),
    "checkpoint": Topic(
        "checkpoint size, write time and Young's interval",
        "size = bytes/param * P;  t = size / (bandwidth * writers);  tau = sqrt(2 C F)",
        "Young 1974 for the interval; workbook chapter 7",
        [("--params", positive, None, "P"), ("--precision", PRECISIONS, "mixed", "mixed | fp32"),
         ("--write-bw", non_negative, 0.0, "bytes/s per writer"),
         ("--writers", positive_int, 1, ""),
         ("--mtbf-hours", non_negative, 0.0, "mean time between failures F")],
        _checkpoint),
    "tp": Topic(
        "tensor-parallel shard shapes and all-reduce volume",
        "column W1 [d, 4d/t], row W2 [4d/t, d]; each all-reduce of [b*s, d] sends 2(t-1)/t * b*s*d*bytes",
        "Shoeybi et al. 2019 (Megatron-LM), section 3; workbook chapter 6",
        [("--hidden", positive_int, None, "d"), ("--seq", positive_int, None, "s"),
         ("--batch", positive_int, None, "b"), ("--tp", positive_int, None, "t")],
        _tp),
    "lr": Topic(
        "learning-rate scaling rules and warmup",
        "linear: lr * B_new/B_base;  sqrt: lr * sqrt(B_new/B_base);  warmup = (B_new/B_base) * 1000",
        "Goyal et al. 2017 (linear rule), Krizhevsky 2014 (square-root rule); workbook chapter 3",
        [("--base-lr", positive, None, ""), ("--base-batch", positive_int, None, ""),
         ("--new-batch", positive_int, None, "")],
        _lr),
    "roofline": Topic(
        "ridge point and whether a matmul is compute- or memory-bound",
        "ridge = peak FLOP/s / bandwidth;  matmul intensity = 2MNK / (bytes (MK + KN + MN))",
        "Williams et al. 2009 (roofline); chapter 26 exercise 26.9",
        [("--peak-tflops", positive, None, ""), ("--bandwidth", positive, None, "bytes/s"),
         ("--m", non_negative_int, 0, ""), ("--n", non_negative_int, 0, ""),
         ("--k", non_negative_int, 0, ""), ("--bytes-per-element", positive, 2.0, "")],
        _roofline),
    "batch": Topic(
        "gradient accumulation steps for a target batch",
        "B_eff = micro_batch * accumulation_steps * DP",
        "workbook chapter 2",
        [("--target", positive_int, None, "target global batch"),
         ("--micro", positive_int, None, "per-GPU micro-batch"),
         ("--dp", positive_int, None, "data-parallel ranks")],
        _batch),
}


# the newer models' topics (MoE, sequence parallelism, Llama, block formats)
TOPICS.update(model_commands.TOPICS)


def add_calc_parser(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Wire ``minidist calc`` into the command line; returns its runner."""
    topics = parser.add_subparsers(dest="topic", required=True, metavar="TOPIC")
    parsers = {name: add_topic_parser(topics, name, topic) for name, topic in TOPICS.items()}

    def run(ns: argparse.Namespace) -> int:
        topic = TOPICS[ns.topic]
        try:
            lines = topic.run(ns)
        except ValueError as e:   # a combination the flag checks cannot see: a usage error
            parsers[ns.topic].error(str(e))
        print(f"{ns.topic}: {topic.formula}")
        for line in lines:
            print("  " + line)
        return 0
    return run
