"""Numerically stable softmax and log-softmax along one axis.

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j
    log_softmax(x)_i = x_i - m - log sum_j exp(x_j - m)

Subtracting the max changes nothing mathematically and keeps exp() from
overflowing. Backward, with s = softmax(x) and upstream gradient g:
    softmax:     dx = s * (g - sum_j g_j s_j)
    log_softmax: dx = g - s * sum_j g_j
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.backend import xp


def softmax_array(x, axis: int = -1):
    """Plain-array softmax (no graph): used inside other ops."""
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    return e


def log_softmax_array(x, axis: int = -1):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, axis=-1):
        s = softmax_array(x, axis)
        ctx.save_for_backward(s)
        ctx.axis = axis
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved
        return s * (grad - (grad * s).sum(axis=ctx.axis, keepdims=True))


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx, x, axis=-1):
        out = log_softmax_array(x, axis)
        ctx.save_for_backward(out)
        ctx.axis = axis
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved
        return grad - xp.exp(out) * grad.sum(axis=ctx.axis, keepdims=True)
