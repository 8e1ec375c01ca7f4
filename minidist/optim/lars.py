"""LARS: momentum SGD with a per-layer learning rate from a trust ratio.

You, Gitman & Ginsburg, "Large Batch Training of Convolutional Networks"
(2017), Algorithm 1. For each parameter tensor (a "layer") with gradient g,
global learning rate eta, trust coefficient c, weight decay lambda, momentum mu:

    local_lr = c * ||w|| / (||g|| + lambda * ||w||)    (1 when ||w|| or ||g|| is 0)
    v <- mu * v + eta * local_lr * (g + lambda * w)     (v starts at 0)
    w <- w - v

Why: the ratio ||w|| / ||g|| varies by orders of magnitude between layers, so
one global learning rate that is safe for the most sensitive layer is far too
small for the rest. local_lr sizes each layer's step relative to its weights.
c (0.001 in the paper) says how far, relative to ||w||, one step may go; it
also means the global eta is large (e.g. 1 to 20) compared with plain SGD's.

The norms are over the whole tensor: for a parameter that ``fully_shard`` or a
tensor-parallel plan cut into pieces, ``LARS`` all-reduces the sums of squares over
the pieces' holders (``optim.whole_norm``), as LAMB does.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from minidist.backend import xp
from minidist.optim.clip import l2_norm, whole_norm
from minidist.optim.optimizer import Optimizer, check_non_negative


def lars_update(param: Any, grad: Any, momentum_buffer: Any, *, lr: float,
                momentum: float = 0.9, weight_decay: float = 0.0,
                trust_coefficient: float = 0.001,
                norm: Callable[[Any], float] | None = None) -> float:
    """One LARS step on arrays: updates ``param`` and ``momentum_buffer`` in place.

    Returns local_lr (without the global eta), for a learner to watch. ``norm``: the
    2-norm of an array shaped like ``param`` (default: its own; for a piece, the whole
    tensor's: ``optim.whole_norm``).
    """
    norm = norm or l2_norm
    w_norm = norm(param)                                 # one host sync per norm
    g_norm = norm(grad)
    # local_lr = c * ||w|| / (||g|| + lambda * ||w||). A zero norm would freeze a
    # zero-initialised layer (||w|| = 0) or divide by 0 (||g|| = 0, lambda = 0):
    # then the layer takes the plain step, local_lr = 1.
    if w_norm > 0 and g_norm > 0:
        local_lr = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm)
    else:
        local_lr = 1.0
    # v <- mu * v + eta * local_lr * (g + lambda * w)
    step = grad + weight_decay * param if weight_decay != 0 else grad.copy()
    step *= lr * local_lr
    momentum_buffer *= momentum
    momentum_buffer += step
    param -= momentum_buffer                             # w <- w - v
    return local_lr


class LARS(Optimizer):
    """Layer-wise Adaptive Rate Scaling over momentum SGD (rule in the module docstring).

    There is no torch.optim.LARS; defaults follow the paper (momentum 0.9,
    trust_coefficient 0.001). ``lr`` is the global eta. State per parameter:
    ``'momentum_buffer'`` (v).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1.0, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001):
        check_non_negative(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if trust_coefficient <= 0:
            raise ValueError(f"invalid trust_coefficient: {trust_coefficient} (must be > 0)")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient))

    def _update(self, p, group, state) -> None:
        if not state:
            state["momentum_buffer"] = xp.zeros_like(p.data)
        lars_update(p.data, p.grad, state["momentum_buffer"], lr=group["lr"],
                    momentum=group["momentum"], weight_decay=group["weight_decay"],
                    trust_coefficient=group["trust_coefficient"], norm=whole_norm(p))
