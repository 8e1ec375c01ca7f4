"""Reductions over axes: sum, mean, max, var (with ``keepdims``).

Each output element gathered several inputs; backward sends the output's
gradient back to each of them, weighted by its local derivative:
    sum:  1            mean: 1/n
    max:  1/k for each of the k inputs equal to the max (ties share it)
    var:  2 (x - mean) / (n - correction)
"""
from __future__ import annotations

import math
import warnings

from minidist.autograd.function import Function
from minidist.autograd.ops._util import expand_reduced, normalize_axes
from minidist.backend import xp


def _count(shape, axes) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


class Sum(Function):
    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False):
        ctx.axes = normalize_axes(axis, a.ndim)
        ctx.shape, ctx.keepdims = a.shape, keepdims
        return a.sum(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad):
        g = expand_reduced(grad, ctx.shape, ctx.axes, ctx.keepdims)
        return xp.broadcast_to(g, ctx.shape)


class Mean(Function):
    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False):
        ctx.axes = normalize_axes(axis, a.ndim)
        ctx.shape, ctx.keepdims = a.shape, keepdims
        return a.mean(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad):
        g = expand_reduced(grad, ctx.shape, ctx.axes, ctx.keepdims)
        g = g / _count(ctx.shape, ctx.axes)
        return xp.broadcast_to(g, ctx.shape)


class Max(Function):
    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False):
        axes = normalize_axes(axis, a.ndim)
        m = a.max(axis=axes, keepdims=True)
        ctx.save_for_backward(a, m)
        ctx.axes, ctx.keepdims = axes, keepdims
        return m if keepdims else m.reshape([n for i, n in enumerate(a.shape) if i not in axes])

    @staticmethod
    def backward(ctx, grad):
        a, m = ctx.saved
        g = expand_reduced(grad, a.shape, ctx.axes, ctx.keepdims)
        is_max = (a == m).astype(a.dtype)
        return is_max * (g / is_max.sum(axis=ctx.axes, keepdims=True))


class Var(Function):
    """Variance with PyTorch's default ``correction=1`` (unbiased)."""

    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False, correction=1):
        axes = normalize_axes(axis, a.ndim)
        centered = a - a.mean(axis=axes, keepdims=True)
        denom = _count(a.shape, axes) - correction
        ctx.save_for_backward(centered)
        ctx.axes, ctx.keepdims, ctx.denom = axes, keepdims, denom
        if denom <= 0:  # no degrees of freedom left: nan, as torch (which also warns)
            warnings.warn(f"var(): degrees of freedom n - correction = {denom} <= 0; "
                          "the result is nan", stacklevel=2)
        return (centered * centered).sum(axis=axes, keepdims=keepdims) / max(denom, 0)

    @staticmethod
    def backward(ctx, grad):
        (centered,) = ctx.saved
        g = expand_reduced(grad, centered.shape, ctx.axes, ctx.keepdims)
        scale = 2.0 / ctx.denom if ctx.denom != 0 else math.inf  # inf * 0 = nan, as torch
        return g * scale * centered
