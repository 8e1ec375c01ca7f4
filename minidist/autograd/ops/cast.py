"""Casting between float dtypes: the gradient is cast back to the input's dtype."""
from __future__ import annotations

from minidist.autograd.function import Function


class Cast(Function):
    @staticmethod
    def forward(ctx, a, dtype):
        ctx.dtype = a.dtype
        return a.astype(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.astype(ctx.dtype)
