"""Layer normalisation over the last axis, forward and backward fused.

    mu = mean(x),  var = mean((x - mu)^2),  r = 1 / sqrt(var + eps)
    xhat = (x - mu) * r,   y = xhat * w + b

Backward, with gy the upstream gradient and gx̂ = gy * w (means over the last axis):
    dx = r * (gx̂ - mean(gx̂) - xhat * mean(gx̂ * xhat))
    dw = sum over rows of gy * xhat,   db = sum over rows of gy

The sums of products (the variance, mean(gx̂ * xhat), dw) are written as
``einsum``: one pass over the two operands with no product array in between. On
the CPU each pass over the activations costs about as much as the arithmetic, so
the fewer the passes the faster the layer; the formulas are the ones above.
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.backend import xp


def _row_dot(a, b):
    """sum over the last axis of a * b, kept as an axis of 1: (..., C), (..., C) -> (..., 1)."""
    return xp.einsum("...c,...c->...", a, b)[..., None]


class LayerNorm(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, x, weight=None, bias=None, eps=1e-5):
        c = x.shape[-1]
        mu = x.mean(axis=-1, keepdims=True)                   # (..., 1)
        xhat = x - mu                                         # (..., C), centred
        var = _row_dot(xhat, xhat) / c                        # (..., 1)
        rstd = 1.0 / xp.sqrt(var + eps)                       # (..., 1)
        xhat *= rstd                                          # (..., C)
        ctx.save_for_backward(xhat, rstd, weight)
        y = xhat * weight if weight is not None else xhat.copy()
        if bias is not None:
            y += bias
        return y

    @staticmethod
    def backward(ctx, grad):
        xhat, rstd, weight = ctx.saved
        c = xhat.shape[-1]
        dx = dw = db = None
        needs = ctx.needs_input_grad
        if needs[0]:
            gxhat = grad * weight if weight is not None else grad
            mean_g = gxhat.mean(axis=-1, keepdims=True)       # (..., 1)
            mean_gx = _row_dot(gxhat, xhat) / c               # (..., 1)
            dx = xhat * mean_gx
            dx += mean_g
            xp.subtract(gxhat, dx, out=dx)                    # gx̂ - mean(gx̂) - xhat mean(gx̂ xhat)
            dx *= rstd
        if len(needs) > 1 and needs[1]:
            dw = xp.einsum("nc,nc->c", grad.reshape(-1, c), xhat.reshape(-1, c))
        if len(needs) > 2 and needs[2]:
            db = grad.reshape(-1, c).sum(axis=0)
        grads = (dx, dw, db)
        return grads[:len(needs)]  # one per argument given: LayerNorm.apply(x) has one
