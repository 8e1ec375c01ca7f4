"""A GPT's parameters and FLOPs per iteration; MFU and HFU from a measured step.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 5.1 and appendix. Notation: l layers,
h hidden size, V vocabulary, s sequence length, B global batch (sequences).

Parameters (eq. 2). Per layer: QKV 3h^2 + 3h, output projection h^2 + h, MLP
8h^2 + 4h + h, two LayerNorms 4h, so 12h^2 + 13h; plus token and position
embeddings (V + s) h:

    P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))           GPT-3 175B: 174.6e9

FLOPs per iteration (eq. 3). A layer's forward multiplies matrices worth
24 B s h^2 (QKV 6, projection 2, MLP 16) + 4 B s^2 h (Q K^T and P V); the logit
layer 2 B s h V. Backward is twice the forward; full activation recomputation
runs the layers' forward once more (not the logit layer's):

    with recomputation     F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    without                F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))

Chowdhery et al. 2022 (PaLM), appendix B: model FLOPs utilization counts only
the FLOPs the model needs (no recomputation), hardware FLOPs utilization counts
what the hardware ran (recomputation included):

    MFU = model FLOPs per step / (step seconds x gpus x peak)
    HFU = hardware FLOPs per step / (step seconds x gpus x peak)
    model FLOPs per token = 6 N + 12 L H Q T   (L layers, H heads, Q head size, T seq)

so with full recomputation HFU / MFU = eq. 3 with / without = 4/3 for large h.
"""
from __future__ import annotations

from dataclasses import dataclass


def _check(**values: float) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def gpt_layer_params(hidden: int) -> int:
    """Parameters of one GPT layer, biases and LayerNorms included: 12 h^2 + 13 h."""
    _check(hidden=hidden)
    return 12 * hidden * hidden + 13 * hidden


def gpt_params(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Parameters of a GPT (Narayanan et al. 2021, eq. 2): l (12h^2 + 13h) + (V + s) h.

    Token embeddings V h (shared with the output layer), learned positions s h.
    The final LayerNorm (2h) is left out, as in eq. 2. GPT-3 (l = 96,
    h = 12288, V = 51200, s = 2048): 174,615,822,336 ~ 174.6e9.
    """
    _check(layers=layers, vocab=vocab, seq=seq)
    return layers * gpt_layer_params(hidden) + (vocab + seq) * hidden


def training_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int,
                                 vocab: int, recompute: bool = True) -> float:
    """FLOPs of one training iteration (Narayanan et al. 2021, eq. 3).

    recompute=True: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (full activation
    recomputation: forward, backward = 2 x forward, the layers' forward again);
    recompute=False: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Only matrix
    multiplications are counted, 2 FLOPs per multiply-add. GPT-3 175B with
    B = 1536: 4.51e18 with recomputation, 3.39e18 without.
    """
    _check(batch=batch, seq=seq, layers=layers, hidden=hidden, vocab=vocab)
    base = batch * seq * layers * hidden * hidden
    if recompute:
        return 96 * base * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return 72 * base * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def palm_model_flops_per_token(params: float, layers: int, hidden: int, seq: int) -> float:
    """Model FLOPs per token (PaLM, appendix B): 6 N + 12 L H Q T, with H Q = h.

    6N for the weight matmuls (forward 2N, backward 4N) and 12 L h T for the
    attention scores and their product with V. PaLM 540B (N = 540.35e9, L = 118,
    H = 48, Q = 256, T = 2048): 3.2777e12 FLOPs per token.
    """
    _check(layers=layers, hidden=hidden, seq=seq)
    return 6 * params + 12 * layers * hidden * seq


@dataclass(frozen=True)
class Utilization:
    mfu: float   # model FLOPs (no recomputation) / what the GPUs could have done
    hfu: float   # FLOPs the hardware ran (recomputation included) / the same


def flops_utilization(batch: int, seq: int, layers: int, hidden: int, vocab: int,
                      step_seconds: float, gpus: int, peak_flops: float,
                      recompute: bool = True) -> Utilization:
    """MFU and HFU of a measured training step (PaLM appendix B, with eq. 3's counts).

    MFU divides eq. 3 without recomputation by step_seconds x gpus x peak; HFU
    divides what ran, eq. 3 with recomputation if the run recomputes. They
    differ exactly by the recomputed forward.
    """
    if step_seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"step_seconds and peak_flops must be > 0, got {step_seconds}, "
                         f"{peak_flops}")
    _check(gpus=gpus)
    capacity = step_seconds * gpus * peak_flops
    model = training_flops_per_iteration(batch, seq, layers, hidden, vocab, recompute=False)
    hardware = training_flops_per_iteration(batch, seq, layers, hidden, vocab, recompute)
    return Utilization(model / capacity, hardware / capacity)


def mfu_from_throughput(tokens_per_second: float, flops_per_token: float, gpus: int,
                        peak_flops: float) -> float:
    """MFU = tokens/s x model FLOPs per token / (gpus x peak) (PaLM, appendix B).

    PaLM 540B: 238.3e3 tokens/s on 6144 TPU v4 chips (275e12 FLOP/s each)
    -> 46.2%.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be > 0, got {peak_flops}")
    _check(gpus=gpus)
    return tokens_per_second * flops_per_token / (gpus * peak_flops)
