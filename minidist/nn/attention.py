"""Causal self-attention: multi-head as in GPT-2, and grouped-query as in Llama.

    q, k, v = split(x W_qkv)                     each (B, T, C) -> (B, nh, T, hs)
    y_h = softmax(q_h k_h^T / sqrt(hs) + causal) v_h     for each head h
    out = concat_h(y_h) W_proj

with C = nh * hs. ``attention="naive"`` materialises the (T, T) score matrix
(``minidist.attention.naive_attention``, or op by op with
``nn.functional.scaled_dot_product_attention`` under autocast); ``attention="flash"`` computes
the same tile by tile (``minidist.attention.flash_attention``), keeping only O
and the row logsumexp for backward.

Grouped-query attention (``GroupedQueryAttention``, Llama's; names as Hugging Face's)::

    q = x W_q   (B, T, nh * hd),   k = x W_k, v = x W_v   (B, T, nkv * hd)
    q, k = rope(q), rope(k)                              at each token's position
    y_h = softmax(q_h k_{h // g}^T / sqrt(hd) + causal) v_{h // g},    g = nh / nkv
    out = concat_h(y_h) W_o

Each key/value head serves g query heads, so the KV cache and the K/V projections
shrink by nh / nkv; nkv = nh is multi-head attention, nkv = 1 multi-query.
"""
from __future__ import annotations

from typing import Any

from minidist.attention import flash_attention, naive_attention
from minidist.autograd.functional import split
from minidist.autograd.grad_mode import is_grad_enabled
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.kv_cache import cached_attention_mask
from minidist.nn.layers import Dropout, Linear
from minidist.nn.module import Module
from minidist.nn.rotary import RotaryEmbedding, apply_rotary
from minidist.precision.autocast import get_autocast_policy


def _whole_heads(width: int, head_size: int, n_head: int, name: str) -> int:
    """How many heads of ``head_size`` a projection's ``width`` outputs hold; a width
    that cuts a head (a plan splitting n_head heads over t ranks, t not dividing
    n_head) is an error, not a silent mix of two heads' features."""
    if width % head_size:
        raise ValueError(f"{name} gives {width} features here, not whole heads of "
                         f"{head_size}: its {n_head} heads must be divisible by the "
                         f"tensor-parallel size")
    return width // head_size


class CausalSelfAttention(Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 dtype: str = "float32", std: float | None = None,
                 proj_std: float | None = None, generator: Any = None,
                 attention: str = "naive"):
        super().__init__()
        if attention not in ("naive", "flash"):
            raise ValueError(f"attention must be 'naive' or 'flash', got {attention!r}")
        self.attention = attention
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_head, self.n_embd, self.dropout_p = n_head, n_embd, dropout
        self.c_attn = Linear(n_embd, 3 * n_embd, bias, dtype, std, generator)
        self.c_proj = Linear(n_embd, n_embd, bias, dtype, proj_std or std, generator)
        self.resid_dropout = Dropout(dropout)  # masks from the default generator

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.c_attn(x)                                          # (B, T, 3C)
        B, T, three_w = qkv.shape
        # the heads this module holds, read off c_attn's output: all n_head of them, or
        # n_head / t when a tensor-parallel plan left this rank its heads' q, k, v columns
        w, hs = three_w // 3, self.n_embd // self.n_head
        nh = _whole_heads(w, hs, self.n_head, "c_attn")
        q, k, v = split(qkv, w, axis=2)                               # 3 x (B, T, nh * hs)
        q = q.reshape(B, T, nh, hs).transpose(1, 2)                   # (B, nh, T, hs)
        k = k.reshape(B, T, nh, hs).transpose(1, 2)
        v = v.reshape(B, T, nh, hs).transpose(1, 2)
        p = self.dropout_p if self.training else 0.0
        if self.attention == "flash":
            y = flash_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hs)
        elif get_autocast_policy() is None:
            # one fused op (minidist.attention.naive): fewer passes over the (T, T) matrix
            y = naive_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            # op by op, so that autocast rounds each of the two products as it writes them
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        y = y.transpose(1, 2).reshape(B, T, w)                        # heads side by side
        return self.resid_dropout(self.c_proj(y))


class GroupedQueryAttention(Module):
    """Llama's attention: q/k/v/o projections, rotary positions, nkv key/value heads.

    ``forward(x, position_ids=None, document_ids=None)``: position_ids (T,) or (B, T),
    default 0 .. T-1 over the T positions q_proj returns (under sequence parallelism
    those are the whole sequence, gathered). ``window``: sliding window (keys per row).
    ``attention``: "naive", "flash", or a function with ``naive_attention``'s arguments
    (context parallelism puts ring attention or Ulysses there).
    """

    def __init__(self, n_embd: int, n_head: int, n_kv_head: int, head_dim: int,
                 bias: bool = False, dtype: str = "float32", std: float | None = None,
                 generator: Any = None, attention: str = "naive", window: int | None = None,
                 rope_theta: float = 10000.0):
        super().__init__()
        if not callable(attention) and attention not in ("naive", "flash"):
            raise ValueError(f"attention must be 'naive', 'flash' or a function, "
                             f"got {attention!r}")
        if n_head % n_kv_head:
            raise ValueError(f"num_key_value_heads={n_kv_head} must divide "
                             f"num_attention_heads={n_head}")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.attention, self.window = attention, window
        self.rope = RotaryEmbedding(head_dim, rope_theta)
        self.q_proj = Linear(n_embd, n_head * head_dim, bias, dtype, std, generator)
        self.k_proj = Linear(n_embd, n_kv_head * head_dim, bias, dtype, std, generator)
        self.v_proj = Linear(n_embd, n_kv_head * head_dim, bias, dtype, std, generator)
        self.o_proj = Linear(n_head * head_dim, n_embd, bias, dtype, std, generator)

    def forward(self, x: Tensor, position_ids: Any = None, document_ids: Any = None,
                past_key_value: Any = None) -> Tensor:
        """``past_key_value``: this layer's ``nn.kv_cache.LayerCache`` (decoding: the keys
        and values of earlier tokens are read from it, this call's appended)."""
        hd = self.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)     # (B, T, nh * hd), ...
        B, T, _ = q.shape
        # the heads this module holds, read off the projections' outputs (n_head / t and
        # n_kv_head / t when a tensor-parallel plan split them)
        nh = _whole_heads(q.shape[-1], hd, self.n_head, "q_proj")
        nkv = _whole_heads(k.shape[-1], hd, self.n_kv_head, "k_proj")
        if nh * self.n_kv_head != nkv * self.n_head or v.shape[-1] != k.shape[-1]:
            raise ValueError(f"q_proj gives {nh} query heads, k_proj {nkv} and v_proj "
                             f"{v.shape[-1] // hd} key/value heads here, not the model's "
                             f"{self.n_head} : {self.n_kv_head}: a tensor-parallel plan must "
                             f"split q_proj, k_proj and v_proj alike (each ColwiseParallel)")
        q = q.reshape(B, T, nh, hd).transpose(1, 2)                   # (B, nh, T, hd)
        k = k.reshape(B, T, nkv, hd).transpose(1, 2)                  # (B, nkv, T, hd)
        v = v.reshape(B, T, nkv, hd).transpose(1, 2)
        if position_ids is None:
            position_ids = xp.arange(T)
        if position_ids.shape[-1] != T:
            raise ValueError(f"position_ids cover {position_ids.shape[-1]} tokens, the sequence "
                             f"here has {T} (under context parallelism pass this rank's "
                             f"positions: parallel.context.sequence_positions)")
        cos, sin = self.rope(position_ids, q.dtype)                   # (T or B,T, hd)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        op = self.attention       # a function: context parallelism sets one (parallel/context)
        if not callable(op):
            op = flash_attention if op == "flash" else naive_attention
        if past_key_value is not None:
            y = self._cached(op, q, k, v, past_key_value, document_ids)
        else:
            y = op(q, k, v, is_causal=True, enable_gqa=True, window=self.window,
                   document_ids=document_ids)                        # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, nh * hd)                  # heads side by side
        return self.o_proj(y)

    def _cached(self, op: Any, q: Tensor, k: Tensor, v: Tensor, cache: Any,
                document_ids: Any) -> Tensor:
        """This call's queries against the cached keys and values and its own (kv_cache.py)."""
        if is_grad_enabled():
            raise ValueError("a key/value cache is for inference: run under no_grad() (it "
                             "keeps arrays, so no gradient would reach earlier tokens)")
        if document_ids is not None or op not in (naive_attention, flash_attention):
            raise ValueError("a key/value cache works with one document and naive or flash "
                             "attention in one process")
        past = cache.length
        keys, values = cache.update(k.data, v.data)                  # (B, nkv, past + T, hd)
        mask = cached_attention_mask(past, q.shape[2], self.window)  # (T, past + T)
        return op(q, Tensor(keys), Tensor(values), attn_mask=mask, enable_gqa=True)
