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
        minidist's own GPT (``implementation="minidist"``, what ``plan --measure`` runs)
        keeps what nn.gpt.Block saves (``minidist_layer_activation_bytes``): per layer
        4 sbh + 2 sb whole (the LayerNorms' x_hat and 1/std, the QKV and MLP inputs)
        and 16 sbh + a s^2 b split by tp (Q, K, V, the softmax P, the out-projection
        input, GELU's input and tanh, the second MLP input), no sequence parallelism,
        and 4 sbh more that a Block holds after its forward beyond what it saves
        (the graph's references to the residual stream: tracemalloc on one Block
        measures 4.08-4.4 sbh at four shapes); with tp > 1, 4.6 sbh more, whole (the
        all-reduced outputs of the row-parallel linears and the inputs f passes on:
        4.5-4.65 sbh measured on a ParallelBlock at tp 2, b = 2 and 8).
    logits
        the last stage's logits and their gradient in fp32: 2 x 4 b (s / cp) V / tp.
        minidist's GPT, measured with tracemalloc after its forward at three shapes
        (within 2 %): 1.5 b s V (the logits and the cross-entropy's saved part) and
        10 sbh (embedding output, final LayerNorm, output-layer input), plus one
        b s V temporary of the cross-entropy at the peak: 4 (2.5 bsV / tp + 10 sbh).
        minidist frees the gradients between steps (``zero_grad`` sets them to None)
        everywhere but in DDP, whose buckets hold them (``gradient_as_bucket_view``),
        and its peak is at the end of a forward: no gradients in the peak but DDP's,
        unless a backward ran before it (m > 1 micro-batches without a pipeline, m > p
        with 1F1B, whose stage 0 runs p forwards before its first backward).
    communication buffers
        DDP / ZeRO-1/2: two 25 MiB gradient buckets (torch's bucket_cap_mb), 2 bytes;
        ZeRO-3: the gathered parameters of two layers (the one running, the prefetched).
        minidist's DDP reduces the gradients in place (its buckets are their memory): 0;
        its ZeRO-2 peaks a full gradient's worth (at most a 25 MB bucket) above ZeRO-1
        (measured; docs/planner.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from minidist.calc import memory as state_memory
from minidist.calc import pipeline
from minidist.calc.planner import model
from minidist.calc.planner.layouts import Layout, microbatches, stage_layers
from minidist.calc.planner.presets import ModelSpec, TrainingSetup

BUCKET_BYTES = 25 * 2**20     # torch DDP's default bucket_cap_mb = 25
TP_HELD_SBH = 4.6             # minidist's ParallelBlock holds this many sbh more (measured)


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


def minidist_layer_bytes(spec: ModelSpec, seq: int, batch: int, *, tp: int = 1,
                         sequence_parallel: bool = False, recompute: str = "none",
                         bytes_per_element: float = 4) -> float:
    """Bytes one nn.gpt.Block keeps for backward on one of tp ranks (module docstring):
    (8 sbh + 2 sb [+ 4.6 sbh when tp > 1] + (16 sbh + a s^2 b) / tp) x bytes; full
    recomputation: its input, sbh.
    At tp = 1 this is ``calc.activations.minidist_layer_activation_bytes`` (naive, what
    the Block saves) + 4 sbh (what its graph holds besides)."""
    sbh, sb = seq * batch * spec.hidden, seq * batch
    if recompute == "full":
        return bytes_per_element * sbh
    if recompute != "none":
        raise ValueError(f"minidist's GPT recomputes 'none' or 'full', got {recompute!r}")
    # tensor parallelism: the all-reduced outputs of the row-parallel linears and what f
    # passes on, held by the graph (tracemalloc on a ParallelBlock, tp 2, b 2 and 8)
    tp_held = TP_HELD_SBH * sbh if tp > 1 else 0.0
    return bytes_per_element * (8 * sbh + 2 * sb + tp_held
                                + (16 * sbh + spec.heads * seq * sb) / tp)


def memory_per_gpu(spec: ModelSpec, setup: TrainingSetup, layout: Layout) -> MemoryBreakdown:
    """The fullest stage's memory per GPU (module docstring), part by part."""
    m = microbatches(layout, setup)
    shard = layout.dp * layout.cp
    w = state_memory.STATE_BYTES[setup.precision][0]
    seq = setup.seq // layout.cp
    act_bytes = 2 if setup.precision == "mixed" else 4
    layer_bytes = minidist_layer_bytes if spec.implementation == "minidist" else \
        model.layer_activation_bytes
    one_layer = layer_bytes(
        spec, seq, layout.micro_batch, tp=layout.tp, sequence_parallel=layout.tp > 1,
        recompute=layout.recompute, bytes_per_element=act_bytes)
    full_layer = layer_bytes(
        spec, seq, layout.micro_batch, tp=layout.tp, sequence_parallel=layout.tp > 1,
        bytes_per_element=act_bytes)
    first, middle, last = stage_layers(spec, layout)
    best = None
    for which, layers in (("first", first), ("middle", middle), ("last", last)):
        dense, experts = stage_params(spec, layout, which)
        parts = []
        for share, group in ((dense, shard), (experts, max(1, shard // layout.ep))):
            split = state_memory.model_state_bytes_split(group, layout.zero, setup.precision)
            parts.append([share * x for x in split])
        params, grads, optim = (parts[0][i] + parts[1][i] for i in range(3))
        ddp = layout.zero == 0 and layout.pp == 1 and layout.tp == 1
        if spec.implementation == "minidist" and not ddp and m <= layout.pp:
            grads = 0.0     # freed by zero_grad, none made yet by the forward at the peak
        held = inflight_microbatches(layout, m) if which == "first" else \
            float(min(m, layout.pp - (1 if which == "middle" else layout.pp - 1)))
        activations = layers * one_layer * held
        if layout.recompute == "full":
            activations += full_layer
        if spec.implementation == "minidist":
            bsv, sbh = layout.micro_batch * seq * spec.vocab, layout.micro_batch * seq * spec.hidden
            logits = 4 * (2.5 * bsv / layout.tp + 10 * sbh) if which == "last" else 0.0
        else:
            logits = 2 * 4 * layout.micro_batch * seq * spec.vocab / layout.tp \
                if which == "last" else 0.0
        if layout.zero == 3:
            buffers = 2 * w * model.layer_params(spec) / layout.tp
        elif spec.implementation == "minidist":
            # DDP's buckets are the gradients' own memory; ZeRO-2 holds a full gradient's
            # worth more than ZeRO-1 (at most one 25 MB bucket; measured, in the docs)
            buffers = min(25e6, w * (dense + experts)) if layout.zero == 2 else 0.0
        else:
            buffers = 2 * BUCKET_BYTES
        breakdown = MemoryBreakdown(params, grads, optim, activations, logits, buffers)
        if best is None or breakdown.total > best.total:
            best = breakdown
    return best
