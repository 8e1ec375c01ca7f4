"""Multi-head causal self-attention, as in GPT-2.

    q, k, v = split(x W_qkv)                     each (B, T, C) -> (B, nh, T, hs)
    y_h = softmax(q_h k_h^T / sqrt(hs) + causal) v_h     for each head h
    out = concat_h(y_h) W_proj

with C = nh * hs. ``attention="naive"`` materialises the (T, T) score matrix
(``minidist.attention.naive_attention``, or op by op with
``nn.functional.scaled_dot_product_attention`` under autocast); ``attention="flash"`` computes
the same tile by tile (``minidist.attention.flash_attention``), keeping only O
and the row logsumexp for backward.
"""
from __future__ import annotations

from typing import Any

from minidist.attention import flash_attention, naive_attention
from minidist.autograd.functional import split
from minidist.autograd.tensor import Tensor
from minidist.nn import functional as F
from minidist.nn.layers import Dropout, Linear
from minidist.nn.module import Module
from minidist.precision.autocast import get_autocast_policy


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
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        q, k, v = split(self.c_attn(x), C, axis=2)                    # 3 x (B, T, C)
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
        y = y.transpose(1, 2).reshape(B, T, C)                        # heads side by side
        return self.resid_dropout(self.c_proj(y))
