"""Memory per GPU of a layout, part by part, on its fullest pipeline stage.

    parameters, gradients, optimizer state
        the stage's parameters / tp (experts / (tp ep)), times the bytes per parameter
        of the ZeRO stage over its sharding group (``calc.memory.model_state_bytes_per_param``:
        mixed precision 2 + 2 + 12, sharded one part after another by stages 1, 2, 3).
        The sharding group is dp x cp (context-parallel ranks hold the same weights;
        experts: dp x cp / ep).
    activations
        layers on the stage x one layer's activations for a micro-batch (``model.
        layer_activation_bytes``: flash attention, sequence parallelism whenever tp > 1,
        s / cp tokens per rank) x the micro-batches in flight on the first stage:
            1F1B, ZB-H1   min(m, p)                       (calc.pipeline.peak_inflight)
            interleaved   min(m, p) (1 + (p - 1) / (p v)) (Narayanan et al. 2021, sec. 2.2.2)
        Full recomputation also holds one layer's activations, rebuilt in its backward.
    logits
        the last stage's logits and their gradient in fp32: 2 x 4 b (s / cp) V / tp.
    communication buffers
        DDP / ZeRO-1/2: two 25 MiB gradient buckets (torch's bucket_cap_mb), 2 bytes;
        ZeRO-3: the gathered parameters of two layers (the one running, the prefetched).

minidist's own GPT (what ``plan --measure`` runs) keeps other amounts, measured on
this code: calibration.py holds them, and each term below asks it.
"""
from __future__ import annotations

from dataclasses import dataclass

from minidist.calc import memory as state_memory
from minidist.calc import pipeline
from minidist.calc.planner import calibration, model
from minidist.calc.planner.calibration import (  # noqa: F401 (their old home)
    TP_HELD_SBH, minidist_layer_bytes)
from minidist.calc.planner.layouts import Layout, microbatches, stage_layers
from minidist.calc.planner.presets import ModelSpec, TrainingSetup

BUCKET_BYTES = 25 * 2**20     # torch DDP's default bucket_cap_mb = 25


@dataclass(frozen=True)
class MemoryBreakdown:
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    buffers: float

    @property
    def total(self) -> float:
        return (self.parameters + self.gradients + self.optimizer + self.activations
                + self.logits + self.buffers)


def inflight_microbatches(layout: Layout, m: int) -> float:
    """Micro-batches' worth of a full stage's activations the first stage holds."""
    if layout.pp == 1:
        return 1.0
    held = pipeline.peak_inflight_microbatches(layout.pp, m, "1f1b")
    if layout.schedule == "interleaved":
        p, v = layout.pp, layout.virtual_stages
        return held * (1 + (p - 1) / (p * v))
    return float(held)


def stage_params(spec: ModelSpec, layout: Layout, which: str) -> tuple[float, float]:
    """(dense, expert) parameters one rank of the ``first`` / ``middle`` / ``last`` stage
    holds before ZeRO: the stage's layers (and embedding or output layer) / tp."""
    first, middle, last = stage_layers(spec, layout)
    layers = {"first": first, "middle": middle, "last": last}[which]
    experts = layers * model.expert_params(spec) / (layout.tp * layout.ep)
    dense = layers * (model.layer_params(spec) - model.expert_params(spec)) / layout.tp
    if which == "first" or layout.pp == 1:
        dense += model.embedding_params(spec) / layout.tp
    if which == "last" or layout.pp == 1:
        dense += (model.head_params(spec) or (model.embedding_params(spec) if layout.pp > 1
                                               else 0)) / layout.tp
    return dense, experts


def memory_per_gpu(spec: ModelSpec, setup: TrainingSetup, layout: Layout) -> MemoryBreakdown:
    """The fullest stage's memory per GPU (module docstring), part by part."""
    m = microbatches(layout, setup)
    seq = setup.seq // layout.cp
    act_bytes = 2 if setup.precision == "mixed" else 4
    layer_bytes = calibration.layer_activation_bytes(spec) or model.layer_activation_bytes
    one_layer = layer_bytes(
        spec, seq, layout.micro_batch, tp=layout.tp, sequence_parallel=layout.tp > 1,
        recompute=layout.recompute, bytes_per_element=act_bytes)
    full_layer = layer_bytes(
        spec, seq, layout.micro_batch, tp=layout.tp, sequence_parallel=layout.tp > 1,
        bytes_per_element=act_bytes)
    first, middle, last = stage_layers(spec, layout)
    best = None
    for which, layers in (("first", first), ("middle", middle), ("last", last)):
        params, grads, optim = model_state(spec, setup, layout, which)
        grads = calibration.gradients_at_peak(spec, layout, m, grads)
        held = inflight_microbatches(layout, m) if which == "first" else \
            float(min(m, layout.pp - (1 if which == "middle" else layout.pp - 1)))
        activations = layers * one_layer * held
        if layout.recompute == "full":
            activations += full_layer
        logits = logits_bytes(spec, layout, seq, which)
        buffers = buffer_bytes(spec, setup, layout, which)
        breakdown = MemoryBreakdown(params, grads, optim, activations, logits, buffers)
        if best is None or breakdown.total > best.total:
            best = breakdown
    return best


def model_state(spec: ModelSpec, setup: TrainingSetup, layout: Layout,
                which: str) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer state) bytes on one rank of the stage: dense
    parameters sharded over dp x cp, experts over dp x cp / ep (module docstring)."""
    shard = layout.dp * layout.cp
    dense, experts = stage_params(spec, layout, which)
    parts = []
    for share, group in ((dense, shard), (experts, max(1, shard // layout.ep))):
        split = state_memory.model_state_bytes_split(group, layout.zero, setup.precision)
        parts.append([share * x for x in split])
    params, grads, optim = (parts[0][i] + parts[1][i] for i in range(3))
    return params, grads, optim


def logits_bytes(spec: ModelSpec, layout: Layout, seq: int, which: str) -> float:
    """The last stage's logits and their gradient in fp32: 2 x 4 b (s / cp) V / tp."""
    if which != "last":
        return 0.0
    measured = calibration.logits_bytes(spec, layout, seq)
    if measured is not None:
        return measured
    return 2 * 4 * layout.micro_batch * seq * spec.vocab / layout.tp


def buffer_bytes(spec: ModelSpec, setup: TrainingSetup, layout: Layout, which: str) -> float:
    """ZeRO-3: two layers' gathered parameters; else two gradient buckets."""
    w = state_memory.STATE_BYTES[setup.precision][0]
    if layout.zero == 3:
        return 2 * w * model.layer_params(spec) / layout.tp
    measured = calibration.buffer_bytes(spec, layout, w * sum(stage_params(spec, layout, which)))
    if measured is not None:
        return measured
    return 2 * BUCKET_BYTES
