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

Grouped-query attention (k, v with Hkv < Hq heads): q is viewed as (..., Hkv, g, Lq, E)
and k, v as (..., Hkv, 1, Lk, E), so the matmuls broadcast each key/value head over the
g = Hq / Hkv query heads that read it; dK and dV sum over that axis.
"""
from __future__ import annotations

from typing import Any

from minidist.attention import common
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp


def naive_forward_arrays(q: Any, k: Any, v: Any, mask: Any = None, is_causal: bool = False,
                         scale: float = 1.0, dropout_p: float = 0.0, seed: int = 0,
                         structure: common.Structure | None = None):
    """Arrays in, (O, P, scaled keep mask or None) out; no graph. k and v broadcast
    against q in the matmuls (grouped heads: see ``NaiveAttention``)."""
    structure = structure or common.Structure(is_causal)
    s = xp.matmul(q, xp.swapaxes(k, -1, -2))                  # (..., Lq, Lk)
    s *= scale
    if mask is not None:
        common.apply_mask(s, mask)
    structure.apply(s, 0, 0)
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


def _grouped_views(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any, Any, Any]:
    """q (..., Hq, Lq, E), k, v (..., Hkv, Lk, E) -> q (..., Hkv, g, Lq, E), k and v
    (..., Hkv, 1, Lk, E), and the mask (..., Hq or 1, Lq, Lk) viewed to match."""
    hkv = k.shape[-3]
    g = q.shape[-3] // hkv
    q = q.reshape(q.shape[:-3] + (hkv, g) + q.shape[-2:])
    k = k.reshape(k.shape[:-3] + (hkv, 1) + k.shape[-2:])
    v = v.reshape(v.shape[:-3] + (hkv, 1) + v.shape[-2:])
    if mask is not None:
        heads = (hkv, g) if mask.shape[-3] > 1 else (1, 1)
        mask = mask.reshape(mask.shape[:-3] + heads + mask.shape[-2:])
    return q, k, v, mask


class NaiveAttention(Function):
    """softmax(scale Q K^T + mask) V with dropout; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None, is_causal=False, scale=1.0, dropout_p=0.0, seed=0,
                structure=None):
        ctx.shapes = (q.shape, k.shape, v.shape)
        if q.shape[:-2] != k.shape[:-2]:                       # grouped-query attention
            q, k, v, mask = _grouped_views(q, k, v, mask)
        o, p, keep = naive_forward_arrays(q, k, v, mask, is_causal, scale, dropout_p, seed,
                                          structure)
        ctx.save_for_backward(q, k, v, p, keep)
        ctx.scale = scale
        return o.reshape(ctx.shapes[0][:-1] + (v.shape[-1],))

    @staticmethod
    def backward(ctx, do):
        q, k, v, p, keep = ctx.saved
        q_shape, k_shape, v_shape = ctx.shapes
        do = do.reshape(q.shape[:-1] + (v.shape[-1],))        # grouped view, if any
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
        if q_shape[:-2] != k_shape[:-2]:                       # sum over each group
            dk, dv = dk.sum(axis=-3), dv.sum(axis=-3)
        return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape), None


def naive_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    generator: Any = None, enable_gqa: bool = False,
                    window: int | None = None, document_ids: Any = None) -> Tensor:
    """Attention with PyTorch's ``scaled_dot_product_attention`` semantics, materialising
    the (Lq, Lk) matrix. Dropout draws come from ``generator`` (default: the global one)
    and are the same entries flash attention drops for the same seed.

    ``enable_gqa``: key and value may have fewer heads than query (PyTorch's flag).
    ``window``: with ``is_causal``, row i sees keys i - window + 1 .. i (Mistral's
    sliding window). ``document_ids`` (L,) or (B, L) integers: packed documents, row i
    sees key j only if both belong to the same document (with ``is_causal``: causal
    within each document).

    Under ``precision.autocast`` the inputs, output and gradients are rounded to its
    format (the op itself computes in the dtype of its inputs).
    """
    return common.apply_attention(NaiveAttention, query, key, value, attn_mask, dropout_p,
                                  is_causal, scale, generator, enable_gqa, window, document_ids)
