"""Memory cost models: model states per GPU (DDP, ZeRO), layer inputs, checkpoints.

Model states are counted in bytes per parameter (workbook ch. 1, worked
solutions "16 bytes/param", quiz Q7 and Q16), split into three parts that ZeRO
shards one after another:

    precision   weights  grads  optimizer                         total
    "mixed"     2 fp16   2 fp16  12 = 4 fp32 master + 4 m + 4 v     16
    "fp32"      4        4       8 = 4 m + 4 v (no master copy)      16

    DDP     w + g + o                      mixed: 16      fp32: 16
    ZeRO-1  w + g + o/N                           4 + 12/N       8 + 8/N
    ZeRO-2  w + (g + o)/N                         2 + 14/N       4 + 12/N
    ZeRO-3  (w + g + o)/N                         16/N           16/N

Memory is in bytes; the source documents quote GB = 1e9 bytes.
"""
from __future__ import annotations

import math

# bytes per parameter: (weights, gradients, optimizer state) for Adam
STATE_BYTES = {
    "mixed": (2, 2, 12),   # fp16/bf16 weight and grad; fp32 master, m, v
    "fp32": (4, 4, 8),     # fp32 weight and grad; fp32 m, v
}


def model_state_bytes_split(gpus: int = 1, stage: int = 0,
                            precision: str = "mixed") -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per parameter on each GPU.

    Stage s shards the optimizer state (s >= 1), then gradients (s >= 2), then
    weights (s = 3) across the N GPUs; see the table in the module docstring.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage is 0 (plain DDP), 1, 2 or 3, got {stage}")
    if precision not in STATE_BYTES:
        raise ValueError(f"precision is one of {sorted(STATE_BYTES)}, got {precision!r}")
    if gpus < 1:
        raise ValueError(f"need at least one GPU, got {gpus}")
    weights, grads, optimizer = STATE_BYTES[precision]
    if stage >= 1:
        optimizer = optimizer / gpus
    if stage >= 2:
        grads = grads / gpus
    if stage == 3:
        weights = weights / gpus
    return weights, grads, optimizer


def model_state_bytes_per_param(gpus: int = 1, stage: int = 0,
                                precision: str = "mixed") -> float:
    """Bytes per parameter held on each GPU for Adam under DDP (stage 0) or ZeRO-1/2/3.

    The sum of ``model_state_bytes_split``; see the table in the module docstring.
    Workbook 1.2: 4 + 12/64 = 4.1875; 1.3: 2 + 14/64 = 2.21875; 1.4: 16/64 = 0.25.
    """
    return sum(model_state_bytes_split(gpus, stage, precision))


def zero_memory_per_gpu(params: float, gpus: int, stage: int,
                        precision: str = "mixed") -> float:
    """Bytes of model states (weights + grads + Adam state) per GPU.

    params x model_state_bytes_per_param(gpus, stage, precision). Activations are
    not included. Workbook 1.1-1.4 (7B: 112, 29.3, 15.5, 1.75 GB on 64 GPUs);
    worked solutions (13B on 32 GPUs: 208, 57, 32, 6.5 GB).
    """
    return params * model_state_bytes_per_param(gpus, stage, precision)


def ddp_memory_per_gpu(params: float, precision: str = "mixed") -> float:
    """Bytes of model states per GPU under plain DDP: 16 P for Adam, either precision.

    Worked solutions: 1B params -> 16 GB. Quiz Q7 (FP32: 4P + 4P + 8P).
    """
    return zero_memory_per_gpu(params, 1, 0, precision)


def checkpoint_bytes(params: float, precision: str = "mixed",
                     extra_bytes: float = 0.0) -> float:
    """Bytes of a full training checkpoint: weights and optimizer state, no gradients.

    mixed: 2 (fp16 weights) + 4 (fp32 master) + 4 (m) + 4 (v) = 14 bytes/param;
    fp32: 4 + 4 + 4 = 12. extra_bytes covers the step counter, LR and RNG state.
    Workbook 7.1: 70B -> 140 + 280 + 280 + 280 = 980 GB.
    """
    weights, _grads, optimizer = STATE_BYTES[precision]
    return params * (weights + optimizer) + extra_bytes


def checkpoint_write_seconds(size_bytes: float, bandwidth: float, writers: int = 1) -> float:
    """Seconds to write a checkpoint: size / (bandwidth x writers).

    writers > 1 is a sharded checkpoint, each rank writing its shard in parallel
    at the same bandwidth. Workbook 7.2: 980 GB / 10 GB/s = 98 s; / 64 = 1.5 s.
    """
    return size_bytes / (bandwidth * writers)


def layer_inputs_memory(batch: int, seq_len: int, hidden: int, layers: int,
                        bytes_per_element: float = 2.0, tensors_per_layer: float = 2.0) -> float:
    """Bytes of the sublayer inputs (the workbook's activation count), for L layers.

    layers x tensors_per_layer x b x s x d elements x bytes per element, where
    the workbook keeps 2 tensors of shape (b, s, d) per layer: the inputs to the
    attention and to the FFN (ex. 8.5). FP16/BF16: 2 bytes, FP8: 1 byte.
    Workbook 8.5: 80 x 2 x 4 x 4096 x 8192 = 21,474,836,480 elements = 42.95 GB in FP16.

    This is what a run keeps when it recomputes each sublayer in backward, not
    what a layer keeps without recomputation: that is
    ``calc.activation_memory_per_layer`` (Korthikanti et al. 2022), 34 + 5as/h
    bytes per s b h instead of 4 here; for GPT-3 28x more, mostly attention scores.
    """
    return layers * tensors_per_layer * batch * seq_len * hidden * bytes_per_element


activation_memory = layer_inputs_memory   # the earlier name of the same count


def sqrt_checkpoint_interval(layers: int) -> int:
    """Checkpoint every k ~ sqrt(L) layers (quiz Q12; chapter 26 ex. 26.13), as an integer.

    Keeping L/k boundary activations and recomputing one k-layer segment at a
    time costs L/k + k layers of activations, smallest at k = sqrt(L).
    """
    return max(1, round(math.sqrt(layers)))


def checkpoint_stored_fraction(layers: int, interval: int) -> float:
    """Fraction of the layers' activations kept between forward and backward.

    ceil(L/k) / L: only each segment's input is kept. Quiz Q12: 48 layers,
    k = 7 -> 7/48 = 14.6%, i.e. ~85% less activation memory.
    """
    return math.ceil(layers / interval) / layers


def checkpoint_peak_fraction(layers: int, interval: int) -> float:
    """Peak activation memory with checkpointing as a fraction of storing every layer.

    (ceil(L/k) + k) / L: the kept segment inputs, plus one segment of k layers
    recomputed in full during its backward. At k = sqrt(L) this is ~2/sqrt(L):
    48 layers -> 14/48 = 29%. Quiz Q12's "~85%" reduction counts the kept inputs
    only (``checkpoint_stored_fraction``); with the live segment it is ~71%.
    """
    return (math.ceil(layers / interval) + interval) / layers


def recompute_overhead(forward_cost: float = 1.0, backward_cost: float = 2.0) -> float:
    """Extra compute of full activation checkpointing, as a fraction of a training step.

    One more forward per step: F / (F + B), with backward ~ 2x forward -> 1/3.
    Quiz Q12 and workbook 2.5: "~33% additional compute".
    """
    return forward_cost / (forward_cost + backward_cost)
