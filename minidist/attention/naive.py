"""Naive attention: the whole (Lq, Lk) score matrix at once, one fused autograd op.

Forward, with s = scale * q k^T (scale = 1/sqrt(E) unless given)::

    S  = scale * Q K^T + mask                      (..., Lq, Lk)
    P  = softmax(S)  (rows where every key is masked: 0, not NaN)
    Pd = P * keep / (1 - p)                        dropout on the weights
    O  = Pd V                                      (..., Lq, Ev)

Backward, from dO::

    dV  = Pd^T dO
    dPd = dO V^T,   dP = dPd * keep / (1 - p)
    dS  = P * (dP - D),   D = rowsum(dP * P) = rowsum(dO * O)
    dQ  = scale dS K,     dK = scale dS^T Q

It keeps P, of size Lq x Lk per head, for the backward: the memory cost that flash
attention (flash.py) avoids. This op is the oracle flash is tested against.
"""
from __future__ import annotations

from typing import Any

from minidist.attention import common
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp


def naive_forward_arrays(q: Any, k: Any, v: Any, mask: Any = None, is_causal: bool = False,
                         scale: float = 1.0, dropout_p: float = 0.0, seed: int = 0):
    """Arrays in, (O, P, scaled keep mask or None) out; no graph."""
    s = xp.matmul(q, xp.swapaxes(k, -1, -2))                  # (..., Lq, Lk)
    s *= scale
    if mask is not None:
        common.apply_mask(s, mask)
    if is_causal:
        common.apply_causal(s, 0, 0)
    m = s.max(axis=-1, keepdims=True)                          # (..., Lq, 1)
    m = xp.where(m == common.NEG_INF, 0.0, m)                  # fully masked row: no NaN
    s -= m
    p = xp.exp(s, out=s)
    total = p.sum(axis=-1, keepdims=True)
    p /= xp.where(total == 0, 1.0, total)
    keep = None
    if dropout_p > 0:
        lead = q.shape[:-2]
        n = 1
        for size in lead:
            n *= size
        lq, lk = q.shape[-2], k.shape[-2]
        keep = common.dropout_scale(seed, dropout_p, n, (0, lq), (0, lk), lq, lk, q.dtype)
        keep = keep.reshape(lead + (lq, lk))
    pd = p if keep is None else p * keep
    return xp.matmul(pd, v), p, keep                           # O: (..., Lq, Ev)


class NaiveAttention(Function):
    """softmax(scale Q K^T + mask) V with dropout; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None, is_causal=False, scale=1.0, dropout_p=0.0, seed=0):
        o, p, keep = naive_forward_arrays(q, k, v, mask, is_causal, scale, dropout_p, seed)
        ctx.save_for_backward(q, k, v, p, keep)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, p, keep = ctx.saved
        pd = p if keep is None else p * keep
        dv = xp.matmul(xp.swapaxes(pd, -1, -2), do)            # (..., Lk, Ev)
        dp = xp.matmul(do, xp.swapaxes(v, -1, -2))             # (..., Lq, Lk)
        if keep is not None:
            dp *= keep
        dp -= (dp * p).sum(axis=-1, keepdims=True)             # dP - D
        dp *= p                                                # dS
        dq = xp.matmul(dp, k)
        dq *= ctx.scale
        dk = xp.matmul(xp.swapaxes(dp, -1, -2), q)
        dk *= ctx.scale
        return dq, dk, dv, None


def naive_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    generator: Any = None) -> Tensor:
    """Attention with PyTorch's ``scaled_dot_product_attention`` semantics, materialising
    the (Lq, Lk) matrix. Dropout draws come from ``generator`` (default: the global one)
    and are the same entries flash attention drops for the same seed.

    Under ``precision.autocast`` the inputs, output and gradients are rounded to its
    format (the op itself computes in the dtype of its inputs).
    """
    return common.apply_attention(NaiveAttention, query, key, value, attn_mask, dropout_p,
                                  is_causal, scale, generator)
