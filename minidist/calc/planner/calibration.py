"""minidist's own GPT, measured on this code: where it departs from the published models.

memory.py and time.py are the published models (Korthikanti et al., DeepSpeed,
Megatron). ``plan --measure`` runs minidist's own GPT (``implementation="minidist"``,
machine.py), which keeps other amounts; each term of those models asks this file,
which answers None (or the published value back) for every other implementation.

    activations   what nn.gpt.Block keeps (``minidist_layer_bytes``): per layer
                  4 sbh + 2 sb whole (the LayerNorms' x_hat and 1/std, the QKV and MLP
                  inputs) and 16 sbh + a s^2 b split by tp (Q, K, V, the softmax P, the
                  out-projection input, GELU's input and tanh, the second MLP input), no
                  sequence parallelism, and 4 sbh more that a Block holds after its
                  forward beyond what it saves (the graph's references to the residual
                  stream: tracemalloc on one Block measures 4.08-4.4 sbh at four shapes);
                  with tp > 1, 4.6 sbh more, whole (the all-reduced outputs of the
                  row-parallel linears and the inputs f passes on: 4.5-4.65 sbh measured
                  on a ParallelBlock at tp 2, b = 2 and 8).
    logits        measured with tracemalloc after the forward at three shapes (within
                  2 %): 1.5 b s V (the logits and the cross-entropy's saved part) and
                  10 sbh (embedding output, final LayerNorm, output-layer input), plus one
                  b s V temporary of the cross-entropy at the peak: 4 (2.5 bsV / tp + 10 sbh).
    gradients     freed between steps (``zero_grad`` sets them to None) everywhere but in
                  DDP, whose buckets hold them (``gradient_as_bucket_view``), and the peak
                  is at the end of a forward: no gradients in the peak but DDP's, unless
                  a backward ran before it (m > 1 micro-batches without a pipeline, m > p
                  with 1F1B, whose stage 0 runs p forwards before its first backward).
    buffers       DDP reduces the gradients in place (its buckets are their memory): 0;
                  ZeRO-2 peaks a full gradient's worth (at most a 25 MB bucket) above
                  ZeRO-1 (measured; docs/planner.md).
    compute       ZeRO-3 (parallel/zero/zero3.py) runs each unit's forward again in
                  backward, from the regathered weights: its layers' matmuls, 2 N_layer
                  FLOPs per token and layer, and 4/3 the per-layer overhead.
"""
from __future__ import annotations

from typing import Callable

from minidist.calc.planner.layouts import Layout
from minidist.calc.planner.presets import ModelSpec

TP_HELD_SBH = 4.6             # minidist's ParallelBlock holds this many sbh more (measured)
ZERO2_EXTRA_BYTES = 25e6      # minidist's ZeRO-2 peak above ZeRO-1: at most one 25 MB bucket


def is_minidist(spec: ModelSpec) -> bool:
    """Whether ``spec`` is minidist's own GPT, the one these measurements are of."""
    return spec.implementation == "minidist"


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


def layer_activation_bytes(spec: ModelSpec) -> Callable[..., float] | None:
    """minidist's count of one layer's activations, or None: the published one."""
    return minidist_layer_bytes if is_minidist(spec) else None


def gradients_at_peak(spec: ModelSpec, layout: Layout, m: int, grads: float) -> float:
    """The gradient bytes at the memory peak: ``grads``, or none for minidist where
    no backward has run before the peak and nothing holds them (module docstring)."""
    ddp = layout.zero == 0 and layout.pp == 1 and layout.tp == 1
    if is_minidist(spec) and not ddp and m <= layout.pp:
        return 0.0     # freed by zero_grad, none made yet by the forward at the peak
    return grads


def logits_bytes(spec: ModelSpec, layout: Layout, seq: int) -> float | None:
    """minidist's last stage's logits at the peak, 4 (2.5 bsV / tp + 10 sbh), or None."""
    if not is_minidist(spec):
        return None
    bsv, sbh = layout.micro_batch * seq * spec.vocab, layout.micro_batch * seq * spec.hidden
    return 4 * (2.5 * bsv / layout.tp + 10 * sbh)


def buffer_bytes(spec: ModelSpec, layout: Layout, gradient_bytes: float) -> float | None:
    """minidist's communication buffers outside ZeRO-3, or None (module docstring)."""
    if not is_minidist(spec):
        return None
    # DDP's buckets are the gradients' own memory; ZeRO-2 holds a full gradient's
    # worth more than ZeRO-1 (at most one 25 MB bucket; measured, in the docs)
    return min(ZERO2_EXTRA_BYTES, gradient_bytes) if layout.zero == 2 else 0.0


def reruns_units(spec: ModelSpec, layout: Layout) -> bool:
    """Whether minidist's ZeRO-3 runs every unit's forward again in backward (without
    full recomputation, which reruns it anyway)."""
    return is_minidist(spec) and layout.zero == 3 and layout.recompute != "full"
