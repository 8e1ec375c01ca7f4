"""Matrix products: batched ``matmul`` and the fused ``linear`` layer op.

For C = A @ B (batched over leading axes, broadcast like NumPy):
    dL/dA = dL/dC @ B^T        dL/dB = A^T @ dL/dC
summed over any batch axes that broadcasting added.
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.autograd.ops._util import unbroadcast
from minidist.backend import xp

# every product goes through xp.matmul (not the @ operator) so that
# backend.MatmulFlopCounter sees it


def _swap_last(x):
    return x.swapaxes(-1, -2)


class MatMul(Function):
    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, a, b):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul needs operands of 2 or more dimensions, got "
                             f"shapes {tuple(a.shape)} and {tuple(b.shape)}; "
                             "reshape a vector to (1, n) or (n, 1)")
        ctx.save_for_backward(a, b)
        return xp.matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved
        ga = unbroadcast(xp.matmul(grad, _swap_last(b)), a.shape) if ctx.needs_input_grad[0] else None
        gb = unbroadcast(xp.matmul(_swap_last(a), grad), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Linear(Function):
    """y = x W^T + b, with W of shape (out, in) as in ``torch.nn.Linear``.

    The leading axes of x are folded into one, so forward and both weight
    gradients are single large matrix products (what BLAS is fast at):
        x2: (N, in)   y2 = x2 @ W^T: (N, out)
        dx2 = g2 @ W   dW = g2^T @ x2   db = sum_N g2
    """

    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        n_in = x.shape[-1]
        x2 = x.reshape(-1, n_in)                    # (N, in)
        y = xp.matmul(x2, weight.T)                 # (N, out)
        if bias is not None:
            y += bias
        ctx.save_for_backward(x2, weight)
        ctx.x_shape = x.shape
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved
        g2 = grad.reshape(-1, weight.shape[0])      # (N, out)
        gx = xp.matmul(g2, weight).reshape(ctx.x_shape) if ctx.needs_input_grad[0] else None
        gw = xp.matmul(g2.T, x2) if ctx.needs_input_grad[1] else None
        if len(ctx.needs_input_grad) == 2:  # called without a bias
            return gx, gw
        gb = g2.sum(axis=0) if ctx.needs_input_grad[2] else None
        return gx, gw, gb
