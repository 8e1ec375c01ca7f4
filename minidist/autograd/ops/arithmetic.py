"""Elementwise arithmetic: + - * / negation and power, with broadcasting.

For z = f(a, b) the backward returns (dL/dz * dz/da, dL/dz * dz/db), each summed
back to its input's shape (``unbroadcast``). Arguments that are plain numbers
are constants and get no gradient.
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.autograd.ops._util import shape_of, unbroadcast
from minidist.backend import xp


class Add(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = shape_of(a), shape_of(b)
        return a + b

    @staticmethod
    def backward(ctx, grad):                    # dz/da = 1, dz/db = 1
        sa, sb = ctx.shapes
        ga = unbroadcast(grad, sa) if ctx.needs_input_grad[0] else None
        gb = unbroadcast(grad, sb) if ctx.needs_input_grad[1] else None
        return ga, gb


class Sub(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = shape_of(a), shape_of(b)
        return a - b

    @staticmethod
    def backward(ctx, grad):                    # dz/da = 1, dz/db = -1
        sa, sb = ctx.shapes
        ga = unbroadcast(grad, sa) if ctx.needs_input_grad[0] else None
        gb = unbroadcast(-grad, sb) if ctx.needs_input_grad[1] else None
        return ga, gb


class Mul(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, grad):                    # dz/da = b, dz/db = a
        a, b = ctx.saved
        ga = unbroadcast(grad * b, shape_of(a)) if ctx.needs_input_grad[0] else None
        gb = unbroadcast(grad * a, shape_of(b)) if ctx.needs_input_grad[1] else None
        return ga, gb


class Div(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a / b

    @staticmethod
    def backward(ctx, grad):                    # dz/da = 1/b, dz/db = -a/b^2
        a, b = ctx.saved
        ga = unbroadcast(grad / b, shape_of(a)) if ctx.needs_input_grad[0] else None
        gb = (unbroadcast(-grad * a / (b * b), shape_of(b))
              if ctx.needs_input_grad[1] else None)
        return ga, gb


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, grad):
        return -grad


class Pow(Function):
    """a ** p, for a tensor base and a number or tensor exponent."""

    @staticmethod
    def forward(ctx, a, p):
        out = a ** p
        ctx.save_for_backward(a, p, out)
        return out

    @staticmethod
    def backward(ctx, grad):                    # dz/da = p a^(p-1), dz/dp = a^p ln a
        a, p, out = ctx.saved
        ga = gp = None
        zero = xp.zeros((), grad.dtype)
        if ctx.needs_input_grad[0]:
            # a^0 is constant: its derivative is 0, also at a = 0 (not 0 * 0^-1 = nan)
            # (xp.asarray: p may be a number, and CuPy's where takes only an array condition)
            ga = unbroadcast(xp.where(xp.asarray(p == 0), zero, grad * p * a ** (p - 1)),
                             shape_of(a))
        if ctx.needs_input_grad[1]:
            # 0^p is 0 or 1 for every p >= 0: flat, not 0 * log 0 = nan
            flat = (a == 0) & (p >= 0)
            gp = unbroadcast(xp.where(flat, zero, grad * out * xp.log(a)), shape_of(p))
        return ga, gp
