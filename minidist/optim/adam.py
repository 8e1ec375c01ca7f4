"""Adam (with L2 weight decay) and AdamW (with decoupled weight decay).

With gradient g_t at step t = 1, 2, ..., betas (beta1, beta2), eps, learning
rate eta, weight decay lambda (PyTorch's conventions exactly):

    Adam:   g_t <- g_t + lambda * w_{t-1}              (L2: decay enters the moments)
    AdamW:  w_{t-1} <- (1 - eta * lambda) * w_{t-1}     (decoupled: decay skips them)

    m_t = beta1 * m_{t-1} + (1 - beta1) * g_t           (first moment, m_0 = 0)
    v_t = beta2 * v_{t-1} + (1 - beta2) * g_t^2         (second moment, v_0 = 0)
    m_hat = m_t / (1 - beta1^t)                         (bias correction: the moments
    v_hat = v_t / (1 - beta2^t)                          start at 0, not at E[g])
    w_t = w_{t-1} - eta * m_hat / (sqrt(v_hat) + eps)

    AMSGrad (amsgrad=True; Reddi et al., "On the Convergence of Adam and Beyond",
    2018, as torch.optim does it): keep v_max_t = max(v_max_{t-1}, v_t) and divide
    by sqrt(v_max_t / (1 - beta2^t)) + eps instead, so the step size never grows
    back after a large gradient has passed.

Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (2019) explain
the difference: under Adam's L2 form a parameter with large gradients is
divided by a large sqrt(v_hat) and so decays less; AdamW decays every
weight by the same factor.
"""
from __future__ import annotations

from typing import Any, Iterable

from minidist.backend.blocks import blocked
from minidist.backend import xp
from minidist.optim import fused_adam
from minidist.optim.optimizer import Optimizer, check_non_negative


def adam_direction(grad: Any, exp_avg: Any, exp_avg_sq: Any, step: int, *, beta1: float,
                   beta2: float, eps: float, out: Any, max_exp_avg_sq: Any = None) -> Any:
    """Advance the moments in place and write ``m_hat / (sqrt(v_hat) + eps)`` into ``out``.

    ``step`` is t, counting from 1. ``out`` is a scratch array shaped like
    ``grad`` (it may not alias grad or the moments). Shared by Adam, AdamW and LAMB.
    With ``max_exp_avg_sq`` (AMSGrad) that running maximum of v is updated in
    place and takes v's place in the denominator. The arrays are swept block by
    block, so that ``out`` stays in the cache (backend/blocks.py).
    """
    arrays = (grad, exp_avg, exp_avg_sq, out)
    if max_exp_avg_sq is not None:
        arrays += (max_exp_avg_sq,)
    blocked(lambda *blocks: _adam_direction_chain(*blocks, step=step, beta1=beta1,
                                                  beta2=beta2, eps=eps), *arrays)
    return out


def _adam_direction_chain(grad: Any, exp_avg: Any, exp_avg_sq: Any, out: Any,
                          max_exp_avg_sq: Any = None, *, step: int, beta1: float,
                          beta2: float, eps: float) -> None:
    """adam_direction's arithmetic on one block of its arrays."""
    # m_t = beta1 * m_{t-1} + (1 - beta1) * g_t   (out is scratch here)
    exp_avg *= beta1
    xp.multiply(grad, 1 - beta1, out=out)
    exp_avg += out
    # v_t = beta2 * v_{t-1} + (1 - beta2) * g_t^2
    exp_avg_sq *= beta2
    xp.multiply(grad, grad, out=out)
    out *= 1 - beta2
    exp_avg_sq += out
    # m_hat / (sqrt(v_hat) + eps), in PyTorch's order of operations (so float32
    # results round alike): denominator sqrt(v_t) / sqrt(1 - beta2^t) + eps first.
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    if max_exp_avg_sq is not None:                       # AMSGrad: v_max = max(v_max, v_t)
        xp.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        exp_avg_sq = max_exp_avg_sq
    xp.sqrt(exp_avg_sq, out=out)
    out /= bias_correction2 ** 0.5
    out += eps
    xp.divide(exp_avg, out, out=out)
    out /= bias_correction1


def adam_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, step: int, *,
                lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 0.0, max_exp_avg_sq: Any = None) -> None:
    """One Adam step on arrays (L2 weight decay): updates param and moments in place.

    Pass ``max_exp_avg_sq`` (zeros at first) for AMSGrad.
    """
    if max_exp_avg_sq is None and fused_adam.applies(param, grad, exp_avg, exp_avg_sq):
        return fused_adam.adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, beta1=beta1,
                                    beta2=beta2, eps=eps, weight_decay=weight_decay,
                                    decoupled=False)     # the chain below in one GPU kernel
    if weight_decay != 0:
        grad = grad + weight_decay * param               # g_t + lambda * w; p.grad untouched
    direction = adam_direction(grad, exp_avg, exp_avg_sq, step, beta1=beta1, beta2=beta2,
                               eps=eps, out=xp.empty_like(param),
                               max_exp_avg_sq=max_exp_avg_sq)
    direction *= lr
    param -= direction                                   # w_t = w - eta * m_hat / (...)


def adamw_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, step: int, *,
                 lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.01, max_exp_avg_sq: Any = None) -> None:
    """One AdamW step on arrays (decoupled weight decay): updates param and moments in place.

    Pass ``max_exp_avg_sq`` (zeros at first) for AMSGrad.
    """
    if max_exp_avg_sq is None and fused_adam.applies(param, grad, exp_avg, exp_avg_sq):
        return fused_adam.adam_step(param, grad, exp_avg, exp_avg_sq, step, lr=lr, beta1=beta1,
                                    beta2=beta2, eps=eps, weight_decay=weight_decay,
                                    decoupled=True)      # the chain below in one GPU kernel
    if weight_decay != 0:
        param *= 1 - lr * weight_decay                   # w <- (1 - eta * lambda) * w
    direction = adam_direction(grad, exp_avg, exp_avg_sq, step, beta1=beta1, beta2=beta2,
                               eps=eps, out=xp.empty_like(param),
                               max_exp_avg_sq=max_exp_avg_sq)
    direction *= lr
    param -= direction


def _check_adam_args(lr: float, betas: tuple[float, float], eps: float,
                     weight_decay: float) -> None:
    check_non_negative(lr=lr, eps=eps)
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"invalid betas: {betas} (need two values in [0, 1))")
    check_non_negative(weight_decay=weight_decay)


class Adam(Optimizer):
    """Adam with L2 weight decay; arguments and defaults as ``torch.optim.Adam``.

    State per parameter: ``'step'`` (int t), ``'exp_avg'`` (m), ``'exp_avg_sq'`` (v),
    and with ``amsgrad=True`` ``'max_exp_avg_sq'`` (the running maximum of v).
    """

    _update_fn = staticmethod(adam_update)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False):
        _check_adam_args(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=bool(amsgrad)))

    def _update(self, p, group, state) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(p.data)
            state["exp_avg_sq"] = xp.zeros_like(p.data)
            if group.get("amsgrad"):
                state["max_exp_avg_sq"] = xp.zeros_like(p.data)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        amsgrad = {"max_exp_avg_sq": state["max_exp_avg_sq"]} if group.get("amsgrad") else {}
        self._update_fn(p.data, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"],
                        lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                        weight_decay=group["weight_decay"], **amsgrad,
                        **self._per_parameter(p))

    def _per_parameter(self, p: Any) -> dict:
        """Extra keywords of the update function for ``p`` (LAMB: how to take norms)."""
        return {}


class AdamW(Adam):
    """Adam with decoupled weight decay; arguments and defaults as ``torch.optim.AdamW``.

    The only differences from ``Adam``: the decay rule, and the default
    ``weight_decay=0.01``.
    """

    _update_fn = staticmethod(adamw_update)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)
