"""Layer normalisation over the last axis, forward and backward fused.

    mu = mean(x),  var = mean((x - mu)^2),  r = 1 / sqrt(var + eps)
    xhat = (x - mu) * r,   y = xhat * w + b

Backward, with gy the upstream gradient and gx̂ = gy * w (means over the last axis):
    dx = r * (gx̂ - mean(gx̂) - xhat * mean(gx̂ * xhat))
    dw = sum over rows of gy * xhat,   db = sum over rows of gy
"""
from __future__ import annotations

from minidist.autograd.function import Function


class LayerNorm(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, x, weight=None, bias=None, eps=1e-5):
        mu = x.mean(axis=-1, keepdims=True)
        centered = x - mu
        var = (centered * centered).mean(axis=-1, keepdims=True)
        rstd = 1.0 / (var + eps) ** 0.5                       # (..., 1)
        xhat = centered * rstd                                # (..., C)
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
            mean_g = gxhat.mean(axis=-1, keepdims=True)
            mean_gx = (gxhat * xhat).mean(axis=-1, keepdims=True)
            dx = rstd * (gxhat - mean_g - xhat * mean_gx)
        if len(needs) > 1 and needs[1]:
            dw = (grad * xhat).reshape(-1, c).sum(axis=0)
        if len(needs) > 2 and needs[2]:
            db = grad.reshape(-1, c).sum(axis=0)
        grads = (dx, dw, db)
        return grads[:len(needs)]  # one per argument given: LayerNorm.apply(x) has one
