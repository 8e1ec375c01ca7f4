"""Root-mean-square normalisation over the last axis (Llama's RMSNorm), fused.

    r = 1 / sqrt(mean(x^2) + eps),   xhat = x * r,   y = xhat * w

No centring and no bias, unlike LayerNorm. Backward, with gy the upstream gradient
and gx̂ = gy * w (means over the last axis, C features):

    dx = r * (gx̂ - xhat * mean(gx̂ * xhat))
    dw = sum over rows of gy * xhat

(from d xhat_i / d x_j = r (delta_ij - xhat_i xhat_j / C)).
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.backend import xp


def _row_dot(a, b):
    """sum over the last axis of a * b, kept as an axis of 1: (..., C), (..., C) -> (..., 1)."""
    return xp.einsum("...c,...c->...", a, b)[..., None]


class RMSNorm(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, x, weight=None, eps=1e-6):
        c = x.shape[-1]
        rstd = 1.0 / xp.sqrt(_row_dot(x, x) / c + eps)        # (..., 1)
        xhat = x * rstd                                       # (..., C)
        ctx.save_for_backward(xhat, rstd, weight)
        return xhat * weight if weight is not None else xhat.copy()

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, weight = ctx.saved
        c = xhat.shape[-1]
        dx = dw = None
        needs = ctx.needs_input_grad
        if needs[0]:
            gxhat = grad * weight if weight is not None else grad
            dx = xhat * (_row_dot(gxhat, xhat) / c)           # xhat mean(gx̂ xhat)
            xp.subtract(gxhat, dx, out=dx)
            dx *= rstd
        if len(needs) > 1 and needs[1]:
            dw = xp.einsum("nc,nc->c", grad.reshape(-1, c), xhat.reshape(-1, c))
        grads = (dx, dw)
        return grads[:len(needs)]
