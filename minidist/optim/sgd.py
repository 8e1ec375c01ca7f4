"""Stochastic gradient descent with momentum, weight decay and Nesterov.

With gradient g_t, weight decay lambda, momentum mu, dampening tau, learning
rate eta (PyTorch's conventions exactly):

    g_t <- g_t + lambda * w_{t-1}                      (weight decay, as an L2 term)
    b_1  = g_1                                         (first step: no dampening)
    b_t  = mu * b_{t-1} + (1 - tau) * g_t              (later steps)
    d_t  = g_t + mu * b_t   if nesterov  else  b_t
    w_t  = w_{t-1} - eta * d_t

With mu = 0 there is no buffer and d_t = g_t. Note that eta multiplies the
buffer on the way out, not on the way in: changing eta mid-run (a schedule)
rescales the whole accumulated velocity at once, which is what PyTorch does.
"""
from __future__ import annotations

from typing import Any, Iterable

from minidist.optim.optimizer import Optimizer, check_non_negative


def sgd_update(param: Any, grad: Any, momentum_buffer: Any | None, *, lr: float,
               momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
               nesterov: bool = False) -> Any | None:
    """One SGD step on arrays: updates ``param`` (and the buffer) in place.

    ``momentum_buffer`` is ``None`` on the first step; the buffer to keep for the
    next step is returned (``None`` when ``momentum == 0``). ``grad`` is not modified.
    """
    if weight_decay != 0:
        grad = grad + weight_decay * param               # a new array: p.grad stays as it was
    if momentum != 0:
        if momentum_buffer is None:
            momentum_buffer = grad.copy()                # b_1 = g_1
        else:
            momentum_buffer *= momentum                  # b_t = mu * b_{t-1} + (1 - tau) * g_t
            if dampening == 0:
                momentum_buffer += grad
            else:
                momentum_buffer += (1 - dampening) * grad
        if nesterov:
            grad = grad + momentum * momentum_buffer     # d_t = g_t + mu * b_t
        else:
            grad = momentum_buffer                       # d_t = b_t
    param -= lr * grad                                   # w_t = w_{t-1} - eta * d_t
    return momentum_buffer


class SGD(Optimizer):
    """SGD with optional momentum, dampening, weight decay and Nesterov momentum.

    Same arguments, defaults and update as ``torch.optim.SGD`` (the rule is in
    this module's docstring; the arithmetic is in ``sgd_update``). State per
    parameter: ``'momentum_buffer'`` once momentum is used.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        check_non_negative(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def _update(self, p, group, state) -> None:
        buf = sgd_update(p.data, p.grad, state.get("momentum_buffer"), lr=group["lr"],
                         momentum=group["momentum"], dampening=group["dampening"],
                         weight_decay=group["weight_decay"], nesterov=group["nesterov"])
        if buf is not None:
            state["momentum_buffer"] = buf
