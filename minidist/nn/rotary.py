"""Rotary position embeddings (RoPE), paired the way Hugging Face's Llama pairs them.

A head vector x of size d is split in halves (x1, x2) = (x[:d/2], x[d/2:]); feature i
of the first half and feature i of the second form a 2-D pair that is turned by the
angle p * f_i, where p is the token's position and

    f_i = theta^(-2i / d),   i = 0 .. d/2 - 1          (theta = rope_theta, 10000 or 500000)

    cos, sin = cos(p f), sin(p f), each repeated twice: (..., d)
    rotate_half(x) = (-x2, x1)
    y = x * cos + rotate_half(x) * sin

Backward: rotate_half is the linear map R = [[0, -I], [I, 0]], whose transpose is
R^T g = (g2, -g1), so

    dx = g * cos + R^T(g * sin)

Why it encodes relative position: q at position m and k at position n, both turned,
give q_m . k_n = q . R(f (n - m)) k, a function of n - m only (docs/llama.md shows it
numerically). The positions are explicit: a packed row restarts them per document,
and a context-parallel shard passes its tokens' global positions.

The table is computed in float64 and rounded once to the model's dtype (Hugging Face
computes it in float32; the two agree to float32 rounding at the positions tested).
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp


def inv_freq(head_dim: int, theta: float = 10000.0) -> Any:
    """f_i = theta^(-2i/d) for i = 0 .. d/2 - 1, in float64: (d/2,)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings pair features: head_dim must be even, "
                         f"got {head_dim}")
    return 1.0 / (theta ** (xp.arange(0, head_dim, 2, dtype="float64") / head_dim))


def rotary_cos_sin(positions: Any, head_dim: int, theta: float = 10000.0,
                   dtype: Any = "float32") -> tuple[Any, Any]:
    """cos and sin of p f for integer ``positions`` (...,): each (..., head_dim)."""
    angles = positions.astype("float64")[..., None] * inv_freq(head_dim, theta)  # (..., d/2)
    angles = xp.concatenate([angles, angles], axis=-1)                          # (..., d)
    return xp.cos(angles).astype(dtype), xp.sin(angles).astype(dtype)


def rotate_half(x: Any) -> Any:
    """(x1, x2) -> (-x2, x1) over the last axis (an array function)."""
    h = x.shape[-1] // 2
    return xp.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rotate_half_transposed(g: Any) -> Any:
    """R^T g: (g1, g2) -> (g2, -g1), the backward of ``rotate_half``."""
    h = g.shape[-1] // 2
    return xp.concatenate([g[..., h:], -g[..., :h]], axis=-1)


class Rotary(Function):
    """y = x cos + rotate_half(x) sin; cos and sin are constants (no gradient)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        y = rotate_half(x)
        y *= sin
        y += x * cos
        return y

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved
        dx = rotate_half_transposed(grad * sin)
        dx += grad * cos
        return dx, None, None


def apply_rotary(x: Tensor, cos: Any, sin: Any) -> Tensor:
    """Turn x (B, nh, T, d) by the table of its positions: cos, sin (T, d) or (B, T, d)."""
    if cos.ndim == 3:                                      # per-row positions: a head axis
        cos, sin = cos[:, None], sin[:, None]              # (B, 1, T, d)
    return Rotary.apply(x, cos, sin)


class RotaryEmbedding:
    """The table maker of a model: ``cos, sin = rope(positions, dtype)`` (no parameters,
    as Hugging Face's ``LlamaRotaryEmbedding``, which keeps only ``inv_freq``)."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        inv_freq(head_dim, theta)                          # refuses an odd head_dim now
        self.head_dim, self.theta = head_dim, theta

    def __call__(self, positions: Any, dtype: Any = "float32") -> tuple[Any, Any]:
        return rotary_cos_sin(positions, self.head_dim, self.theta, dtype)
