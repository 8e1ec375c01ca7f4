"""Elementwise functions of one tensor, each with its local derivative.

    exp:     d/dx e^x = e^x                 log:  1/x
    sqrt:    1 / (2 sqrt x)                 tanh: 1 - tanh^2 x
    relu:    1 if x > 0 else 0              sigmoid: s (1 - s)
    silu:    x s, s = sigmoid(x)            d/dx = s (1 + x (1 - s))
    gelu (tanh form, as GPT-2):  0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
        d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
"""
from __future__ import annotations

import math

from minidist.autograd.function import Function
from minidist.backend.blocks import blocked
from minidist.backend import xp


class Exp(Function):
    @staticmethod
    def forward(ctx, a):
        out = xp.exp(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved
        return grad * out


class Log(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a)
        return xp.log(a)

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved
        return grad / a


class Sqrt(Function):
    @staticmethod
    def forward(ctx, a):
        out = xp.sqrt(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved
        return grad / (2 * out)


class Tanh(Function):
    @staticmethod
    def forward(ctx, a):
        out = xp.tanh(a)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved
        return grad * (1 - out * out)


class Relu(Function):
    @staticmethod
    def forward(ctx, a):
        ctx.save_for_backward(a > 0)
        return xp.maximum(a, 0)

    @staticmethod
    def backward(ctx, grad):
        (positive,) = ctx.saved
        return grad * positive


class Sigmoid(Function):
    @staticmethod
    def forward(ctx, a):
        # 1 / (1 + e^-x) overflows for very negative x; this form does not
        e = xp.exp(-xp.abs(a))
        out = xp.where(a >= 0, 1 / (1 + e), e / (1 + e))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved
        return grad * out * (1 - out)


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_forward(a, t, out):
    """t = tanh(u), out = 0.5 a (1 + t), in place on the buffers t and out."""
    xp.multiply(a, a, out=t)                        # a^2
    t *= 0.044715 * _GELU_C
    t += _GELU_C
    t *= a                                          # u = sqrt(2/pi) (a + 0.044715 a^3)
    xp.tanh(t, out=t)                               # t = tanh(u)
    xp.add(t, 1, out=out)
    out *= a
    out *= 0.5                                      # 0.5 a (1 + t)


def _gelu_backward(a, t, grad, d):
    """d = grad * dGELU/da, in place on the buffer d."""
    # d/da = 0.5 (1 + t) + 0.5 a (1 - t^2) du/da,  du/da = sqrt(2/pi) (1 + 3 * 0.044715 a^2)
    xp.multiply(a, a, out=d)
    d *= 3 * 0.044715 * _GELU_C
    d += _GELU_C                                    # du/da
    d *= a
    one_minus_t2 = t * t                            # a block's worth: stays in cache
    xp.subtract(1, one_minus_t2, out=one_minus_t2)
    d *= one_minus_t2                               # a (1 - t^2) du/da
    d += t
    d += 1
    d *= 0.5
    d *= grad


class Gelu(Function):
    """GELU, tanh approximation (``torch.nn.functional.gelu(approximate='tanh')``).

    This op runs on the widest activation of a transformer (B, T, 4C), where
    every sweep over memory costs: the arithmetic is done in place on one or two
    buffers, and block by block so that those stay in the cache (backend/blocks.py).
    """

    @staticmethod
    def forward(ctx, a):
        t, out = xp.empty(a.shape, a.dtype), xp.empty(a.shape, a.dtype)
        blocked(_gelu_forward, a, t, out)
        ctx.save_for_backward(a, t)
        return out

    @staticmethod
    def backward(ctx, grad):
        a, t = ctx.saved
        d = xp.empty(a.shape, a.dtype)
        blocked(_gelu_backward, a, t, grad, d)
        return d


class Silu(Function):
    """SiLU (swish), x * sigmoid(x): the gate of Llama's SwiGLU MLP."""

    @staticmethod
    def forward(ctx, a):
        e = xp.exp(-xp.abs(a))                      # sigmoid without overflow, as Sigmoid
        s = xp.where(a >= 0, 1 / (1 + e), e / (1 + e))
        ctx.save_for_backward(a, s)
        return a * s

    @staticmethod
    def backward(ctx, grad):
        a, s = ctx.saved
        d = 1 - s                                   # s (1 + a (1 - s))
        d *= a
        d += 1
        d *= s
        d *= grad
        return d
