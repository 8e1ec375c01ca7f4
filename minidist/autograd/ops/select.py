"""Choosing between values by a boolean condition: ``where`` and ``masked_fill``.

The gradient goes to whichever input was chosen, element by element; the
condition itself is not differentiable.
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.autograd.ops._util import shape_of, unbroadcast
from minidist.backend import xp


class Where(Function):
    """out = a where cond else b."""

    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        ctx.shapes = shape_of(a), shape_of(b)
        return xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, grad):
        (cond,) = ctx.saved
        zero = xp.zeros((), grad.dtype)
        ga = unbroadcast(xp.where(cond, grad, zero), ctx.shapes[0]) if ctx.needs_input_grad[1] else None
        gb = unbroadcast(xp.where(cond, zero, grad), ctx.shapes[1]) if ctx.needs_input_grad[2] else None
        return None, ga, gb


class MaskedFill(Function):
    """out = value where mask else a (mask broadcasts to a's shape)."""

    @staticmethod
    def forward(ctx, a, mask, value):
        ctx.save_for_backward(mask)
        return xp.where(mask, xp.asarray(value, dtype=a.dtype), a)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved
        return xp.where(mask, xp.zeros((), grad.dtype), grad), None
