"""Step time of a layout, term by term, on its slowest pipeline stage.

    compute   the stage's share of the step's hardware FLOPs (model FLOPs plus what
              recomputation runs again) at the matmul rate the cluster reaches:
              T_c = F_hw x (L_stage p / L) / (GPUs x peak x efficiency)
                    + (1, or 4/3 with full recomputation) x L_stage x m x layer_overhead
              (the fixed cost per layer and micro-batch of a small model on a CPU;
              0 on the GPU presets). minidist's ZeRO-3 (parallel/zero/zero3.py) runs
              each unit's forward again in backward, from the regathered weights: its
              layers' matmuls, 2 N_layer FLOPs per token and layer, and 4/3 the overhead
    bubble    T_c x bubble_fraction(p, m, schedule, v)       (calc.pipeline)
    tp        per layer and micro-batch, 2 collectives of b (s / cp) h elements forward,
              2 backward, 2 more when full recomputation reruns the forward; each a ring
              all-reduce over tp ranks on NVLink (sequence parallelism's all-gather +
              reduce-scatter move the same bytes); on the critical path
    cp        per layer and micro-batch, an all-gather of K and V (2 b s a_kv d bytes)
              forward and a reduce-scatter of their gradients backward (Llama 3's
              context parallelism), on the critical path
    ep        per MoE layer and micro-batch, a dispatch and a combine all-to-all forward
              and backward: 4 x b (s / cp) k h bytes x (ep - 1)/ep each (calc.moe), exposed
    pp        each micro-batch's activation and its gradient cross each stage boundary
              (v times when interleaved): 2 m v sends of b (s / cp) h / tp bytes, exposed
    dp        the stage's gradients (2 bytes each) all-reduced over dp x cp (ZeRO-3:
              all-gather forward and backward + reduce-scatter, 1.5x the bytes), one
              bucket per layer and overlapped with the last micro-batch's backward: only what
              does not hide is exposed (calc.comm.exposed_comm_seconds). ZeRO-2 and 3 hold
              only a shard of the gradients, so they reduce-scatter after every one of the m
              micro-batches (DeepSpeed's behaviour under accumulation): m times the exposure

Elements are 2 bytes in mixed precision, 4 in fp32 (activations and gradients).
A collective whose group fits in a node uses NVLink; one that spans nodes takes the
hierarchical all-reduce (calc.comm.hierarchical_all_reduce_time) or, with one rank per
node, the ring over the NICs.
"""
from __future__ import annotations

from dataclasses import dataclass

from minidist.calc import comm, pipeline
from minidist.calc.planner import model
from minidist.calc.planner.layouts import Layout, microbatches, stage_layers
from minidist.calc.planner.memory import stage_params
from minidist.calc.planner.presets import ClusterSpec, ModelSpec, TrainingSetup


@dataclass(frozen=True)
class TimeBreakdown:
    compute: float
    bubble: float
    tp: float
    cp: float
    ep: float
    pp: float
    dp: float

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.tp + self.cp + self.ep + self.pp + self.dp

    @property
    def exposed_comm(self) -> float:
        return self.tp + self.cp + self.ep + self.pp + self.dp


def group_span(size: int, stride: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, ranks per node) of a mesh group of ``size`` ranks ``stride`` apart."""
    if size * stride <= gpus_per_node:
        return 1, size
    local = max(1, gpus_per_node // stride)
    return size // local, local


def all_reduce_seconds(size_bytes: float, size: int, stride: int,
                       cluster: ClusterSpec) -> float:
    """A ring inside a node; the hierarchical all-reduce across nodes."""
    if size == 1:
        return 0.0
    nodes, local = group_span(size, stride, cluster.gpus_per_node)
    if nodes == 1:
        return comm.ring_all_reduce_time(size_bytes, size, cluster.intra_bandwidth,
                                         cluster.intra_latency)
    if local == 1:
        return comm.ring_all_reduce_time(size_bytes, size, cluster.inter_bandwidth,
                                         cluster.inter_latency)
    return comm.hierarchical_all_reduce_time(size_bytes, nodes, local, cluster.intra_bandwidth,
                                             cluster.inter_bandwidth, cluster.inter_latency)


def all_gather_seconds(size_bytes: float, size: int, stride: int,
                       cluster: ClusterSpec) -> float:
    """Half an all-reduce: an all-gather or a reduce-scatter of ``size_bytes`` in all."""
    return all_reduce_seconds(size_bytes, size, stride, cluster) / 2


def link(size: int, stride: int, cluster: ClusterSpec) -> tuple[float, float]:
    """(bandwidth, latency) of the slowest link a group's messages cross."""
    if size * stride <= cluster.gpus_per_node:
        return cluster.intra_bandwidth, cluster.intra_latency
    return cluster.inter_bandwidth, cluster.inter_latency


def step_time(spec: ModelSpec, setup: TrainingSetup, layout: Layout,
              cluster: ClusterSpec) -> TimeBreakdown:
    """The slowest stage's step time (module docstring), term by term."""
    m = microbatches(layout, setup)
    b, tp, cp, pp = layout.micro_batch, layout.tp, layout.cp, layout.pp
    seq = setup.seq // cp
    layers = max(stage_layers(spec, layout))
    tokens = setup.sequences * setup.seq
    again = model.recompute_flops_per_token(spec, setup.seq, layout.recompute)
    unit_rerun = (spec.implementation == "minidist" and layout.zero == 3
                  and layout.recompute != "full")
    if unit_rerun:      # minidist's ZeRO-3 reruns every unit's forward: the layers' matmuls
        again = spec.layers * 2 * model.active_matmul_params_per_layer(spec)
    flops = tokens * (model.model_flops_per_token(spec, setup.seq) + again)
    share = layers * pp / spec.layers
    compute = flops * share / (layout.gpus * cluster.peak_flops * cluster.matmul_efficiency)
    rerun = 4 / 3 if layout.recompute == "full" or unit_rerun else 1   # fwd: 1/3 of fwd+bwd
    compute += rerun * layers * m * cluster.layer_overhead
    bubble = 0.0
    if pp > 1:
        bubble = compute * pipeline.bubble_fraction(pp, m, layout.schedule,
                                                    layout.virtual_stages)
    width = 2 if setup.precision == "mixed" else 4        # bytes of an activation element
    activation = b * seq * spec.hidden * width
    passes = 6 if layout.recompute == "full" else 4
    tp_time = passes * layers * m * all_reduce_seconds(activation, tp, 1, cluster)
    kv = 2 * b * setup.seq * spec.kv_heads * spec.head_dim * width / tp
    cp_passes = 3 if layout.recompute == "full" else 2
    cp_time = cp_passes * layers * m * all_gather_seconds(kv, cp, tp, cluster)
    ep_time = 0.0
    if spec.moe and layout.ep > 1:
        bandwidth, latency = link(layout.ep, tp, cluster)
        one = b * seq * spec.top_k * spec.hidden * width * (layout.ep - 1) / layout.ep
        ep_time = 4 * layers * m * (one / bandwidth + (layout.ep - 1) * latency)
    pp_time = 0.0
    if pp > 1:
        bandwidth, latency = link(pp, tp * cp * layout.dp, cluster)
        send = activation / tp
        pp_time = 2 * m * layout.virtual_stages * (send / bandwidth + latency)
    dense, experts = stage_params(spec, layout, "middle" if pp > 2 else "first")
    grads = width * (dense + experts)
    dp_group = layout.dp * cp
    bucket = all_reduce_seconds(grads / layers, dp_group, tp, cluster)   # one layer's
    if layout.zero == 3:
        bucket *= 1.5
    dp_time = 0.0
    if dp_group > 1 and m:
        backward_per_layer = (compute / m) * (2 / 3) / layers
        once = comm.exposed_comm_seconds(layers, bucket, backward_per_layer)
        # ZeRO-2/3 keep only their shard of the gradients, so every micro-batch's
        # gradients are reduce-scattered as they are made; DDP and ZeRO-1 accumulate
        # whole gradients and reduce once, after the last micro-batch
        dp_time = once * (m if layout.zero >= 2 else 1)
    return TimeBreakdown(compute, bubble, tp_time, cp_time, ep_time, pp_time, dp_time)


def mfu(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
        seconds: float, hardware: bool = False) -> float:
    """Model FLOPs (no recomputation) / (step seconds x GPUs x peak); hardware=True
    counts the recomputed FLOPs too (HFU, PaLM appendix B)."""
    tokens = setup.sequences * setup.seq
    per_token = model.model_flops_per_token(spec, setup.seq)
    if hardware:
        per_token += model.recompute_flops_per_token(spec, setup.seq, layout.recompute)
    flops = tokens * per_token
    return flops / (seconds * layout.gpus * cluster.peak_flops)
