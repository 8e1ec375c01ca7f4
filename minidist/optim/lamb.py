"""LAMB: Adam's direction, rescaled per layer by a trust ratio.

You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
minutes" (2019). For each parameter tensor (a "layer" l) at step t = 1, 2, ...:

    m_t = beta1 * m_{t-1} + (1 - beta1) * g_t
    v_t = beta2 * v_{t-1} + (1 - beta2) * g_t^2
    m_hat = m_t / (1 - beta1^t),   v_hat = v_t / (1 - beta2^t)
    u_t = m_hat / (sqrt(v_hat) + eps) + lambda * w_{t-1}      (decoupled decay, in u)
    r_t = ||w_{t-1}|| / ||u_t||        (r_t = 1 when either norm is 0)
    w_t = w_{t-1} - eta * r_t * u_t

Why: with a huge batch one wants a large eta, but a single eta is too large
for some layers and too small for others. The trust ratio makes each layer's
step proportional to the size of its weights: ||w_t - w_{t-1}|| = eta * ||w||,
whatever the scale of its gradients. (The paper allows a clipping function
phi(||w||) in the numerator; we use the identity, as most implementations do.)

The two norms are over the whole tensor. A parameter that ``fully_shard``, a
tensor-parallel plan or layer cut is a piece (autograd/pieces.py): ``LAMB`` takes
its norms with ``optim.whole_norm``, which all-reduces the sums of squares of w and u
over the pieces' holders, so the ratio is one process's on every rank
(tests/distributed/test_trust_ratio_on_pieces.py). ZeRO's flat shards cut across
tensors, so ZeRO refuses LAMB.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from minidist.backend import xp
from minidist.optim.adam import Adam, adam_direction
from minidist.optim.clip import l2_norm, whole_norm


def trust_ratio(numerator_norm: float, denominator_norm: float) -> float:
    """``numerator / denominator``, or 1.0 when either is 0.

    A zero weight norm (e.g. a freshly zeroed bias) would freeze the layer at
    0 forever, and a zero update norm would divide by 0: in both cases the
    layer falls back to the plain (unscaled) step.
    """
    if numerator_norm > 0 and denominator_norm > 0:
        return numerator_norm / denominator_norm
    return 1.0


def lamb_update(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, step: int, *,
                lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-6,
                weight_decay: float = 0.01, norm: Callable[[Any], float] | None = None) -> float:
    """One LAMB step on arrays, in place. Returns the trust ratio r_t it used.
    ``norm``: the 2-norm of an array shaped like ``param`` (default: its own; for a
    piece of a larger tensor, the whole tensor's: ``optim.whole_norm``)."""
    norm = norm or l2_norm
    # u_t = m_hat / (sqrt(v_hat) + eps) + lambda * w
    update = adam_direction(grad, exp_avg, exp_avg_sq, step, beta1=beta1, beta2=beta2,
                            eps=eps, out=xp.empty_like(param))
    if weight_decay != 0:
        update += weight_decay * param
    # r_t = ||w|| / ||u||  (float() brings the two norms to the host: one sync per layer)
    ratio = trust_ratio(norm(param), norm(update))
    update *= lr * ratio
    param -= update                                      # w_t = w - eta * r_t * u_t
    return ratio


class LAMB(Adam):
    """Layer-wise Adaptive Moments for Batch training (rule in the module docstring).

    Adam's moments and bias correction, then the layer-wise trust ratio: the
    state handling is Adam's; only the update function differs. Defaults follow
    the paper's BERT setting: betas (0.9, 0.999), eps 1e-6, weight_decay 0.01.
    To leave biases and LayerNorm weights undecayed, put them in a param group
    with ``weight_decay=0``. State per parameter: ``'step'``, ``'exp_avg'``,
    ``'exp_avg_sq'``, as in Adam.
    """

    _update_fn = staticmethod(lamb_update)

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def _per_parameter(self, p: Any) -> dict:
        return {"norm": whole_norm(p)}   # a piece's norms are the whole tensor's
