"""Step time of a layout, term by term, on its slowest pipeline stage.

    compute   the stage's share of the step's hardware FLOPs (model FLOPs plus what
              recomputation runs again) at the matmul rate the cluster reaches:
              T_c = F_hw x (L_stage p / L) / (GPUs x peak x efficiency)
                    + (1, or 4/3 with full recomputation) x L_stage x m x layer_overhead
              (the fixed cost per layer and micro-batch of a small model on a CPU;
              0 on the GPU presets). minidist's ZeRO-3 reruns each unit's forward in
              backward (calibration.py)
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
from minidist.calc.planner import calibration, model
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


# Passes of each collective per layer and micro-batch (module docstring).
TP_PASSES = {"none": 4, "full": 6}      # 2 forward + 2 backward (+ 2 when recomputing)
CP_PASSES = {"none": 2, "full": 3}      # all-gather forward, reduce-scatter backward (+ 1)
EP_PASSES = 4                           # dispatch + combine, forward and backward
PP_PASSES = 2                           # the activation forward, its gradient back
ZERO3_DP_FACTOR = 1.5                   # 2 all-gathers + 1 reduce-scatter = 3 halves of 2
RECOMPUTE_FACTOR = 4 / 3                # forward again: 1/3 of forward + backward
BACKWARD_SHARE = 2 / 3                  # of a layer's forward + backward time


def step_time(spec: ModelSpec, setup: TrainingSetup, layout: Layout,
              cluster: ClusterSpec) -> TimeBreakdown:
    """The slowest stage's step time (module docstring), term by term."""
    m = microbatches(layout, setup)
    layers = max(stage_layers(spec, layout))
    width = 2 if setup.precision == "mixed" else 4        # bytes of an activation element
    compute = compute_seconds(spec, setup, layout, cluster, layers, m)
    bubble = 0.0
    if layout.pp > 1:
        bubble = compute * pipeline.bubble_fraction(layout.pp, m, layout.schedule,
                                                    layout.virtual_stages)
    return TimeBreakdown(compute, bubble,
                         tp_seconds(spec, setup, layout, cluster, layers * m, width),
                         cp_seconds(spec, setup, layout, cluster, layers * m, width),
                         ep_seconds(spec, setup, layout, cluster, layers * m, width),
                         pp_seconds(spec, setup, layout, cluster, m, width),
                         dp_seconds(spec, layout, cluster, layers, m, width, compute))


def compute_seconds(spec: ModelSpec, setup: TrainingSetup, layout: Layout,
                    cluster: ClusterSpec, layers: int, m: int) -> float:
    """T_c = F_hw x (L_stage p / L) / (GPUs x peak x efficiency)
    + (1, or 4/3 rerunning the forward) x L_stage x m x layer_overhead."""
    again = model.recompute_flops_per_token(spec, setup.seq, layout.recompute)
    unit_rerun = calibration.reruns_units(spec, layout)
    if unit_rerun:      # minidist's ZeRO-3 reruns every unit's forward: the layers' matmuls
        again = spec.layers * 2 * model.active_matmul_params_per_layer(spec)
    tokens = setup.sequences * setup.seq
    flops = tokens * (model.model_flops_per_token(spec, setup.seq) + again)
    share = layers * layout.pp / spec.layers
    compute = flops * share / (layout.gpus * cluster.peak_flops * cluster.matmul_efficiency)
    rerun = RECOMPUTE_FACTOR if layout.recompute == "full" or unit_rerun else 1
    return compute + rerun * layers * m * cluster.layer_overhead


def tp_seconds(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
               layer_passes: int, width: int) -> float:
    """TP_PASSES all-reduces of b (s / cp) h elements per layer and micro-batch."""
    activation = layout.micro_batch * (setup.seq // layout.cp) * spec.hidden * width
    passes = TP_PASSES["full" if layout.recompute == "full" else "none"]
    return passes * layer_passes * all_reduce_seconds(activation, layout.tp, 1, cluster)


def cp_seconds(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
               layer_passes: int, width: int) -> float:
    """CP_PASSES all-gathers (or reduce-scatters) of K and V, 2 b s a_kv d / tp bytes."""
    kv = 2 * layout.micro_batch * setup.seq * spec.kv_heads * spec.head_dim * width / layout.tp
    passes = CP_PASSES["full" if layout.recompute == "full" else "none"]
    return passes * layer_passes * all_gather_seconds(kv, layout.cp, layout.tp, cluster)


def ep_seconds(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
               layer_passes: int, width: int) -> float:
    """EP_PASSES all-to-alls of b (s / cp) k h x (ep - 1)/ep bytes per MoE layer."""
    if not spec.moe or layout.ep == 1:
        return 0.0
    ep = layout.ep
    bandwidth, latency = link(ep, layout.tp, cluster)
    one = layout.micro_batch * (setup.seq // layout.cp) * spec.top_k * spec.hidden * width \
        * (ep - 1) / ep
    return EP_PASSES * layer_passes * (one / bandwidth + (ep - 1) * latency)


def pp_seconds(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
               m: int, width: int) -> float:
    """PP_PASSES m v sends of b (s / cp) h / tp bytes across each stage boundary."""
    if layout.pp == 1:
        return 0.0
    bandwidth, latency = link(layout.pp, layout.tp * layout.cp * layout.dp, cluster)
    activation = layout.micro_batch * (setup.seq // layout.cp) * spec.hidden * width
    send = activation / layout.tp
    return PP_PASSES * m * layout.virtual_stages * (send / bandwidth + latency)


def dp_seconds(spec: ModelSpec, layout: Layout, cluster: ClusterSpec, layers: int, m: int,
               width: int, compute: float, zero3_factor: float = ZERO3_DP_FACTOR) -> float:
    """The gradients' all-reduce over dp x cp, a bucket per layer, what the last
    backward does not hide; ZeRO-2/3: after every micro-batch (module docstring).
    ``zero3_factor``: ZeRO-3's bytes against the all-reduce's (overlap.py's gathers)."""
    dp_group = layout.dp * layout.cp
    if dp_group == 1 or not m:
        return 0.0
    dense, experts = stage_params(spec, layout, "middle" if layout.pp > 2 else "first")
    grads = width * (dense + experts)
    bucket = all_reduce_seconds(grads / layers, dp_group, layout.tp, cluster)   # one layer's
    if layout.zero == 3:
        bucket *= zero3_factor
    backward_per_layer = (compute / m) * BACKWARD_SHARE / layers
    once = comm.exposed_comm_seconds(layers, bucket, backward_per_layer)
    # ZeRO-2/3 keep only their shard of the gradients, so every micro-batch's
    # gradients are reduce-scattered as they are made; DDP and ZeRO-1 accumulate
    # whole gradients and reduce once, after the last micro-batch
    return once * (m if layout.zero >= 2 else 1)


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
