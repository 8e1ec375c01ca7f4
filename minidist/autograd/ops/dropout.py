"""Dropout (inverted): zero each element with probability p, scale the rest by 1/(1-p).

    mask ~ Bernoulli(1 - p),  y = x * mask / (1 - p),  dx = g * mask / (1 - p)

so the expected value of y equals x and nothing needs rescaling at eval time.
The mask comes from a seeded ``backend.Generator``: the same seed gives the
same mask on every backend.
"""
from __future__ import annotations

from minidist import backend
from minidist.autograd.function import Function


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p=0.5, generator=None):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        gen = generator if generator is not None else backend.default_generator()
        keep = gen.random(x.shape, dtype=x.dtype) >= p
        scaled_mask = keep.astype(x.dtype) * (1.0 / (1.0 - p))
        ctx.save_for_backward(scaled_mask)
        return x * scaled_mask

    @staticmethod
    def backward(ctx, grad):
        (scaled_mask,) = ctx.saved
        return grad * scaled_mask
