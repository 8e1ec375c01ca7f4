"""1-bit Adam: Adam's variance frozen after a warm-up, then only the momentum's signs travel.

Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale Training with
Adam's Convergence Speed" (arXiv 2102.02888), as DeepSpeed's ``OnebitAdam`` computes
it (its names; like DeepSpeed's, the moments are not bias-corrected). With the
gradient g_i of rank i, betas (beta1, beta2), eps, lr, weight decay lambda:

    warm-up, steps 1 .. freeze_step (plain Adam on the averaged gradient):
        g   = (1/N) sum_i g_i                             all-reduce, 2(N-1)/N * 4n bytes
        m   = beta1 m + (1 - beta1) g
        v   = beta2 v + (1 - beta2) g^2
    compression stage, after freeze_step (v frozen: never updated again):
        m_i = beta1 m + (1 - beta1) g_i                   the local gradient
        m   = compressed_allreduce(m_i)                   signs + one scale (onebit.py),
                                                          worker and server error feedback
    both:
        w  <- w - lr * (m / (sqrt(v) + eps) + lambda w)

Adam's variance settles early in training; once frozen, Adam is a momentum SGD
with a fixed per-coordinate step size, and momentum SGD tolerates 1-bit compression
with error feedback. The bytes of the compression stage are about 1/32 of the
warm-up's (``minidist calc diloco`` counts both).

The optimizer does its own communication (as DeepSpeed's engine turns its backward
all-reduce off for it): use it on a model that is *not* wrapped in DDP. It starts
every rank from the group's first rank's parameters. ``group``: the ranks to average
over (None: the world).
"""
from __future__ import annotations

from typing import Any, Iterable

import minidist.distributed as dist
from minidist.backend import xp
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.optim.optimizer import Optimizer, check_non_negative
from minidist.parallel.data.onebit import compressed_allreduce, new_errors


class OnebitAdam(Optimizer):
    """1-bit Adam (module docstring). State per parameter: ``'step'``, ``'exp_avg'``,
    ``'exp_avg_sq'``; the error-feedback buffers are in ``errors`` (id of the parameter ->
    ``OneBitErrors``), made at the first compressed step."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, freeze_step: int = 100000, group: Any = None):
        check_non_negative(lr=lr, eps=eps, weight_decay=weight_decay)
        if freeze_step < 0:
            raise ValueError(f"freeze_step must be >= 0 (warm-up steps of plain Adam), "
                             f"got {freeze_step}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))
        self.freeze_step = freeze_step
        self.group = group
        self.steps = 0                           # step() calls so far
        self.frozen = freeze_step == 0           # in the compression stage?
        self.errors: dict = {}                   # id(parameter) -> OneBitErrors
        src = 0 if group is None else group.ranks[0]
        for g in self.param_groups:
            for p in g["params"]:
                dist.broadcast(p.data, src=src, group=group)

    def step(self, closure: Any = None) -> Any:
        if not self.frozen:                      # warm-up: average the gradients first
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        dist.all_reduce(p.grad, op=ReduceOp.AVG, group=self.group)
        loss = super().step(closure)
        self.steps += 1
        if self.steps >= self.freeze_step:
            self.frozen = True
        return loss

    def _update(self, p, group, state) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(p.data)
            state["exp_avg_sq"] = xp.zeros_like(p.data)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        m *= beta1
        m += (1 - beta1) * g                                     # m = b1 m + (1 - b1) g
        if not self.frozen:
            v *= beta2
            v += (1 - beta2) * g * g                             # v = b2 v + (1 - b2) g^2
        else:
            if id(p) not in self.errors:
                self.errors[id(p)] = new_errors(m.size, dist.get_world_size(self.group), m.dtype)
            m[...] = compressed_allreduce(m.reshape(-1), self.errors[id(p)],
                                          self.group).reshape(m.shape)
        update = m / (xp.sqrt(v) + group["eps"])
        if group["weight_decay"] > 0:
            update += group["weight_decay"] * p.data
        p.data -= group["lr"] * update
