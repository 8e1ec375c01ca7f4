"""A model's sizes as the planner needs them: parameters, FLOPs per token, activations.

Notation: L layers, h hidden, a heads, a_kv key/value heads, d = h / a the head
size, f the MLP width, V the vocabulary, s the sequence length, b the micro-batch.

Parameters per layer (``calc.tensor.layer_params``, plus norms and biases):

    attention   2 h^2 + 2 h (a_kv d)            Q and O full, K and V a_kv heads wide
    MLP         3 h f (SwiGLU) or 2 h f (GELU); an MoE layer holds E of them + a router h E
    norms       2 h (RMSNorm) or 4 h (LayerNorm with biases); a GPT's biases 9 h

Model FLOPs per token (Narayanan et al. 2021, eq. 3, per token, without recomputation;
PaLM's 6 N + 12 L h s with N the matmul parameters a token runs through):

    F_token = 6 (L (attention + k MLPs) + V h) + 12 L s h

For a GPT this is eq. 3 divided by B s exactly (72 l h^2 + 12 s l h + 6 V h).

Activations a layer keeps for backward generalise Korthikanti et al. 2022, Table 2
(``calc.activations``) to grouped-query attention and gated MLPs, in elements of
s b h (r = a_kv / a, g = f / h):

    kept whole (split by sequence parallelism):  QKV input 1, MLP input 1, norm inputs 2
    split by TP:  Q 1, K and V 2r, out-projection input 1, MLP 2g (GELU) or 3g (SwiGLU)
    masks (1 byte, only with dropout): after attention, after the MLP; the scores' a s^2 b

A GPT (r = 1, g = 4, dropout) gives Korthikanti's 34 + 5 a s / h exactly.
"""
from __future__ import annotations

from minidist.calc import tensor
from minidist.calc.planner.presets import ModelSpec


def mlp_params(spec: ModelSpec) -> int:
    """Parameters of one layer's MLP: dense, or E routed + shared experts and a router."""
    if not spec.moe:
        return tensor.ffn_params(spec.hidden, spec.ffn_hidden, spec.gated)
    width = spec.expert_ffn_hidden or spec.ffn_hidden
    one = tensor.ffn_params(spec.hidden, width, spec.gated)
    return (spec.experts + spec.shared_experts) * one + spec.hidden * spec.experts


def expert_params(spec: ModelSpec) -> int:
    """Parameters of one layer's routed experts: what expert parallelism splits."""
    if not spec.moe:
        return 0
    width = spec.expert_ffn_hidden or spec.ffn_hidden
    return spec.experts * tensor.ffn_params(spec.hidden, width, spec.gated)


def layer_params(spec: ModelSpec) -> int:
    """Parameters of one transformer layer: attention + MLP + norms (+ a GPT's biases)."""
    h = spec.hidden
    attention = tensor.attention_params(h, spec.heads, spec.kv_heads)
    if spec.biases:     # QKV 3h, out h, MLP f + h, two LayerNorms 4h: 13 h for f = 4h
        extras = 3 * h + h + spec.ffn_hidden + h + 4 * h
    else:               # two RMSNorm weights
        extras = 2 * h
    return attention + mlp_params(spec) + extras


def embedding_params(spec: ModelSpec) -> int:
    """Token embeddings (V h) and learned positions (s h, a GPT's)."""
    return (spec.vocab + spec.positions) * spec.hidden


def head_params(spec: ModelSpec) -> int:
    """The output layer V h, or 0 when it is the embedding table (tied)."""
    return 0 if spec.tied else spec.vocab * spec.hidden


def total_params(spec: ModelSpec) -> int:
    """Every parameter: L layers, embeddings, the output layer (the final norm left out,
    as eq. 2 of Narayanan et al. 2021). Llama 3 8B: 8,030,261,248 with the final norm."""
    return spec.layers * layer_params(spec) + embedding_params(spec) + head_params(spec)


def active_matmul_params_per_layer(spec: ModelSpec) -> int:
    """Matmul parameters one token runs through in a layer: attention + k (+ shared) MLPs."""
    attention = tensor.attention_params(spec.hidden, spec.heads, spec.kv_heads)
    if not spec.moe:
        return attention + tensor.ffn_params(spec.hidden, spec.ffn_hidden, spec.gated)
    width = spec.expert_ffn_hidden or spec.ffn_hidden
    one = tensor.ffn_params(spec.hidden, width, spec.gated)
    return attention + (spec.top_k + spec.shared_experts) * one + spec.hidden * spec.experts


def model_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """F_token = 6 (L * layer matmuls + V h) + 12 L s h: what MFU counts (no recompute)."""
    matmuls = spec.layers * active_matmul_params_per_layer(spec) + spec.vocab * spec.hidden
    return 6 * matmuls + 12 * spec.layers * seq * spec.hidden


def recompute_flops_per_token(spec: ModelSpec, seq: int, recompute: str) -> float:
    """FLOPs the hardware runs again per token: a layer forward (full: 2 N_layer + 4 s h
    per layer), or the attention scores and their product with V (selective: 4 s h)."""
    if recompute == "full":
        return spec.layers * (2 * active_matmul_params_per_layer(spec) + 4 * seq * spec.hidden)
    if recompute == "selective":
        return spec.layers * 4 * seq * spec.hidden
    return 0.0


def layer_activation_bytes(spec: ModelSpec, seq: int, batch: int, *, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           flash: bool = True, bytes_per_element: float = 2,
                           mask_bytes: float = 1) -> float:
    """Bytes one layer keeps for backward (module docstring), for a micro-batch of b
    sequences of length s on one of t tensor-parallel ranks."""
    sbh = seq * batch * spec.hidden
    rest = tp if sequence_parallel else 1
    if recompute == "full":
        return bytes_per_element * sbh / rest
    r = spec.kv_heads / spec.heads
    width = (spec.expert_ffn_hidden or spec.ffn_hidden) if spec.moe else spec.ffn_hidden
    mlps = (spec.top_k + spec.shared_experts) if spec.moe else 1
    g = width / spec.hidden
    whole = 1 + 1 + 2                                     # QKV input, MLP input, norm inputs
    split = 1 + 2 * r + 1 + mlps * (3 if spec.gated else 2) * g
    total = bytes_per_element * sbh * (whole / rest + split / tp)
    if spec.dropout:                                      # the two dropout masks
        total += 2 * mask_bytes * sbh / rest
    if recompute == "none" and not flash:
        scores = spec.heads * seq * seq * batch
        per_score = (2 * bytes_per_element + mask_bytes) if spec.dropout else bytes_per_element
        total += per_score * scores / tp
    return total
