"""Cross-entropy of logits against integer class targets, fused with log-softmax.

    loss_i = -log softmax(z_i)[t_i]  =  logsumexp(z_i) - z_i[t_i]
    mean:  L = (1 / n_valid) * sum over i with t_i != ignore_index of loss_i

Backward (per valid row): dL/dz_i = (softmax(z_i) - onehot(t_i)) / n_valid.
Rows whose target is ``ignore_index`` contribute nothing, as in PyTorch; if
every row is ignored the mean is 0/0 = nan and its gradient is 0, again as
PyTorch returns.
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.autograd.ops.softmax import log_softmax_array
from minidist.backend import xp


class CrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, targets, ignore_index=-100, reduction="mean"):
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
        n_classes = logits.shape[-1]
        z = logits.reshape(-1, n_classes)                 # (N, C)
        t = targets.reshape(-1)                           # (N,)
        if z.shape[0] != t.shape[0]:
            raise ValueError(f"logits {tuple(logits.shape)} and targets "
                             f"{tuple(targets.shape)} do not match")
        valid = t != ignore_index
        # a negative target would silently pick a class from the end (as indices
        # wrap); refuse it, as torch does (one device sync per call)
        out_of_range = ((t < 0) | (t >= n_classes)) & valid
        if bool(out_of_range.any()):
            raise IndexError(f"a target is out of range for {n_classes} classes "
                             f"(and is not ignore_index={ignore_index})")
        safe_t = xp.where(valid, t, 0)
        logp = log_softmax_array(z, axis=-1)              # (N, C)
        rows = xp.arange(z.shape[0])
        picked = logp[rows, safe_t]                       # (N,)
        losses = xp.where(valid, -picked, xp.zeros((), z.dtype))
        ctx.save_for_backward(logp, safe_t, valid)
        ctx.shape, ctx.reduction = logits.shape, reduction
        if reduction == "none":
            return losses.reshape(targets.shape)
        if reduction == "sum":
            return losses.sum()
        ctx.n_valid = valid.sum()
        return losses.sum() / ctx.n_valid.astype(z.dtype)

    @staticmethod
    def backward(ctx, grad):
        logp, safe_t, valid = ctx.saved
        g = xp.exp(logp)                                  # softmax, (N, C)
        rows = xp.arange(g.shape[0])
        g[rows, safe_t] -= 1
        g *= valid[:, None]
        if ctx.reduction == "none":
            g *= grad.reshape(-1, 1)
        elif ctx.reduction == "sum":
            g *= grad
        else:
            # every row ignored: g is all 0 already; times grad / 0 = inf it would be nan
            n_valid = xp.maximum(ctx.n_valid, 1).astype(g.dtype)
            g *= grad / n_valid
        return g.reshape(ctx.shape), None
