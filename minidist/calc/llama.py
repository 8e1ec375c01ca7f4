"""A Llama's parameters, training FLOPs and KV-cache bytes, from its config.

Notation (Hugging Face's config names): V vocab_size, h hidden_size, L num_hidden_layers,
nh num_attention_heads, nkv num_key_value_heads, d head_dim (h / nh unless given),
H intermediate_size, s sequence length, B sequences per step.

Parameters. No biases; per layer

    attention  h (nh d) [q] + 2 h (nkv d) [k, v: GQA's saving] + (nh d) h [o]
    SwiGLU     3 h H                     (gate, up, down: three matrices, not two)
    RMSNorm    2 h
    P = V h (embedding) + L (attention + SwiGLU + 2h) + h (final norm) + V h (head, unless tied)

Llama-3 8B (V 128256, h 4096, L 32, nh 32, nkv 8, H 14336, untied): 8,030,261,248;
Llama-3 70B (h 8192, L 80, nh 64, nkv 8, H 28672): 70,553,706,496 -- the counts the
released checkpoints hold. The pieces are ``calc.tensor``'s (attention_params with
head_dim = h / nh, ffn_params gated), which the planner's model sizes use too; this
module adds what a Llama checkpoint holds besides them (norms, an explicit head_dim)
and the KV cache.

Training FLOPs (model FLOPs, no recomputation; 2 per multiply-add, backward twice the
forward). With N_mm the parameters that multiply activations (every matrix but the
embedding table, the head included):

    per token  6 N_mm + 12 L s nh d      (weights; then Q K^T and P V over s keys)
    per step   B s (6 N_mm + 12 L s nh d)

the PaLM count (6N + 12 L H Q T) with N the matmul parameters. GQA lowers N_mm by
2 L h (nh - nkv) d, not the attention term: every query head still scores every key.

KV cache (inference, per sequence of s tokens): 2 (K and V) L nkv d s bytes_per_element;
GQA divides it by nh / nkv. Llama-3 8B in bf16: 131,072 bytes per token (128 KiB),
1 GiB for 8192 tokens; with nkv = nh it would be 4x that.
"""
from __future__ import annotations

from dataclasses import dataclass

from minidist.calc import tensor

# the shapes of the released configs (config.json)
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                 tie_word_embeddings=False)
LLAMA3_70B = dict(vocab_size=128256, hidden_size=8192, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                  tie_word_embeddings=False)
PRESETS = {"llama3-8b": LLAMA3_8B, "llama3-70b": LLAMA3_70B}


@dataclass(frozen=True)
class LlamaParams:
    total: int           # every parameter
    per_layer: int       # one decoder layer
    attention: int       # of which attention, per layer
    mlp: int             # of which SwiGLU, per layer
    embedding: int       # V h (the head adds as much again unless tied)
    matmul: int          # N_mm: the parameters that multiply activations (FLOPs)


def _head_dim(hidden_size: int, num_attention_heads: int, head_dim: int | None) -> int:
    return head_dim if head_dim is not None else hidden_size // num_attention_heads


def _check(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def llama_params(vocab_size: int, hidden_size: int, num_hidden_layers: int,
                 num_attention_heads: int, num_key_value_heads: int, intermediate_size: int,
                 tie_word_embeddings: bool = False, head_dim: int | None = None) -> LlamaParams:
    """Parameters of a Llama (module docstring): Llama-3 8B gives 8,030,261,248."""
    _check(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
           num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
           intermediate_size=intermediate_size)
    if num_attention_heads % num_key_value_heads:
        raise ValueError(f"num_key_value_heads={num_key_value_heads} must divide "
                         f"num_attention_heads={num_attention_heads}")
    h, d = hidden_size, _head_dim(hidden_size, num_attention_heads, head_dim)
    if d * num_attention_heads == h:
        attention = tensor.attention_params(h, num_attention_heads, num_key_value_heads)
    else:       # an explicit head_dim: q and o are h x (nh d), k and v h x (nkv d)
        attention = 2 * h * num_attention_heads * d + 2 * h * num_key_value_heads * d
    mlp = tensor.ffn_params(h, intermediate_size, gated=True)
    layer = attention + mlp + 2 * h
    embedding = vocab_size * h
    head = 0 if tie_word_embeddings else embedding
    total = embedding + num_hidden_layers * layer + h + head
    matmul = num_hidden_layers * (attention + mlp) + embedding      # the head multiplies
    return LlamaParams(total, layer, attention, mlp, embedding, matmul)


def llama_flops_per_token(seq: int, vocab_size: int, hidden_size: int, num_hidden_layers: int,
                          num_attention_heads: int, num_key_value_heads: int,
                          intermediate_size: int, head_dim: int | None = None,
                          tie_word_embeddings: bool = False) -> float:
    """Training FLOPs per token: 6 N_mm + 12 L s nh d (no recomputation). A tied head
    multiplies as an untied one does: ``tie_word_embeddings`` changes nothing here."""
    _check(seq=seq)
    p = llama_params(vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
                     num_key_value_heads, intermediate_size, True, head_dim)
    d = _head_dim(hidden_size, num_attention_heads, head_dim)
    return 6 * p.matmul + 12 * num_hidden_layers * seq * num_attention_heads * d


def llama_training_flops(batch: int, seq: int, **config: int) -> float:
    """FLOPs of one training step on ``batch`` sequences of ``seq`` tokens."""
    _check(batch=batch)
    return batch * seq * llama_flops_per_token(seq, **config)


def kv_cache_bytes(num_hidden_layers: int, num_key_value_heads: int, head_dim: int, seq: int,
                   batch: int = 1, bytes_per_element: float = 2.0) -> float:
    """2 L nkv d s B bytes: K and V of every layer for ``batch`` sequences of ``seq`` tokens."""
    _check(num_hidden_layers=num_hidden_layers, num_key_value_heads=num_key_value_heads,
           head_dim=head_dim, seq=seq, batch=batch)
    return 2 * num_hidden_layers * num_key_value_heads * head_dim * seq * batch * bytes_per_element
