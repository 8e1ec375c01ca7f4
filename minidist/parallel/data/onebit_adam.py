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

The vectors are the model's flattened momentum and gradient: each param group's
parameters that have a gradient, back to back in the group's order (n numbers), as
the paper runs the algorithm on the model's whole vector and DeepSpeed runs it on its
fp16 optimizer's one flat buffer. So a step is ONE all-reduce of the flat gradient
during the warm-up (one bucket) and ONE compressed all-reduce of the flat momentum
after it, per param group, whatever the number of parameters: one scale per worker
for the whole vector, one per server chunk, and the fixed cost of a message paid
4(N-1) times a step, not that many times per parameter (``minidist calc diloco``
counts the same). The vectors are averaged by position, so every rank must give a
gradient to the same parameters, and after the first compressed step to those the
error feedback is laid out over: onebit_layout.py checks it on every rank at once,
with P numbers more in each warm-up all-reduce, one all-reduce at the first
compressed step, and after it no byte and no message more (a rank whose gradients
changed, in any group, refuses the step's compressed all-reduce). The error feedback
is laid out over that flat vector: ``errors`` holds, per param group, one worker error
(n',) and one server error (n'/N,), n' being n padded as onebit.py needs.

Adam's variance settles early in training; once frozen, Adam is a momentum SGD
with a fixed per-coordinate step size, and momentum SGD tolerates 1-bit compression
with error feedback. The bytes of the compression stage are about 1/32 of the
warm-up's (``minidist calc diloco`` counts both).

Saving: ``state_dict()`` holds, beside Adam's buffers, the step count (whether the
variance is frozen yet), this rank's error feedback and the parameters it is laid out
over under ``'onebit'``, so that a run saved and loaded mid-way takes the uninterrupted
run's steps bit for bit. The worker error is this rank's own: save one file per rank
(``save_checkpoint(..., rank0_only=False)``) and load each rank its own, at the same
world size. (DeepSpeed drops the errors on load instead and restarts the feedback
from zero.)

The optimizer does its own communication (as DeepSpeed's engine turns its backward
all-reduce off for it): use it on a model that is *not* wrapped in DDP. It starts
every rank from the group's first rank's parameters. ``group``: the ranks to average
over (None: the world).
"""
from __future__ import annotations

from typing import Any, Iterable

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.optim.optimizer import Optimizer, check_non_negative
from minidist.parallel.data.naive import found_inf_reduce
from minidist.parallel.data.onebit import (OneBitErrors, Refused, compressed_allreduce,
                                           new_errors)
from minidist.parallel.data.onebit_layout import (agree_on_layout, changed_groups, flatten,
                                                  gradient_mask, refuse_changed,
                                                  refuse_left_out, views)


class OnebitAdam(Optimizer):
    """1-bit Adam (module docstring). State per parameter, as Adam's: ``'step'``,
    ``'exp_avg'``, ``'exp_avg_sq'``. ``errors``: param group index -> the group's
    ``OneBitErrors`` (worker (n',), server (n'/N,)) over its flat momentum, made at its
    first compressed step."""

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
        self.errors: dict[int, OneBitErrors] = {}    # param group index -> flat errors
        self._laid_out: dict[int, list[int]] = {}    # ... -> ids the errors are laid out over
        src = 0 if group is None else group.ranks[0]
        for g in self.param_groups:
            for p in g["params"]:
                dist.broadcast(p.data, src=src, group=group)

    def combine_found_inf(self, found_inf: Any) -> Any:
        """GradScaler's found-inf flag over the group (``unscale_`` calls this): each rank
        holds its own gradient, so an inf on one rank must skip the step on all, or the
        rank that skipped would pair its next all-reduce with the others' current one."""
        return found_inf_reduce(self.group)(found_inf)

    def step(self, closure: Any = None) -> Any:
        compressing = self.frozen
        loss = super().step(closure)             # _update_group, once per param group
        if compressing and not self.errors:
            # no group has a gradient on any rank: no compressed all-reduce would tell
            # the peers of one that comes on one rank alone; agree again next step
            self._laid_out.clear()
        self.steps += 1
        if self.steps >= self.freeze_step:
            self.frozen = True
        return loss

    def _update_group(self, group, params) -> None:
        index = next(i for i, g in enumerate(self.param_groups) if g is group)
        states = [self.state.setdefault(p, {}) for p in params]
        for p, state in zip(params, states):
            if not state:
                state["step"] = 0
                state["exp_avg"] = xp.zeros_like(p.data)
                state["exp_avg_sq"] = xp.zeros_like(p.data)
            state["step"] += 1
        beta1, beta2 = group["betas"]
        if not self.frozen:                      # one bucket: the mask, the flat gradient
            have = gradient_mask(group, params)                             # (P,)
            flat = flatten([have] + [p.grad for p in params])               # (P + n,)
            dist.all_reduce(flat, op=ReduceOp.AVG, group=self.group)
            refuse_left_out(index, group, flat[:have.size])
            for state, g in zip(states, views(flat[have.size:], [p.grad for p in params])):
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m *= beta1
                m += (1 - beta1) * g                                 # m = b1 m + (1 - b1) g
                v *= beta2
                v += (1 - beta2) * g * g                             # v = b2 v + (1 - b2) g^2
        else:                                    # the flat local momentum, compressed
            errors = self._errors_of(index, group, params)
            if errors is None:                   # no gradient in this group on any rank
                return
            # a rank whose gradients changed, in any group, refuses (onebit_layout.py)
            refuse = bool(changed_groups(self.param_groups, self._laid_out))
            local = xp.zeros_like(errors.worker) if refuse else flatten(
                [beta1 * s["exp_avg"] + (1 - beta1) * p.grad                # (n,) m_i
                 for p, s in zip(params, states)])
            try:
                m = compressed_allreduce(local, errors, self.group, refuse=refuse)
            except Refused:                      # on every rank: name the changes
                refuse_changed(self.param_groups, self._laid_out, self.group)
            for state, piece in zip(states, views(m, [p.data for p in params])):
                state["exp_avg"][...] = piece
        for p, state in zip(params, states):
            update = state["exp_avg"] / (xp.sqrt(state["exp_avg_sq"]) + group["eps"])
            if group["weight_decay"] > 0:
                update += group["weight_decay"] * p.data
            p.data -= group["lr"] * update

    def state_dict(self) -> dict[str, Any]:
        """Adam's state dict, and under ``'onebit'`` the step count and each param group's
        error feedback with the parameters (their indices in the state dict) it is laid
        out over: ``{'steps': int, 'errors': {group: {'worker': (n',), 'server':
        (n'/N,), 'params': [indices]}}, 'empty': [groups]}`` (live arrays, as the
        buffers); ``'empty'``: the groups laid out over no parameter, which a gradient
        must not come to either."""
        saved = super().state_dict()
        index = {id(p): i for i, p in enumerate(
            p for g in self.param_groups for p in g["params"])}
        errors = {g: {"worker": e.worker, "server": e.server,
                      "params": [index[i] for i in self._laid_out[g]]}
                  for g, e in self.errors.items()}
        empty = [g for g in sorted(self._laid_out) if g not in self.errors]
        saved["onebit"] = {"steps": self.steps, "errors": errors, "empty": empty}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore Adam's buffers, the step count and the error feedback (copied)."""
        if "onebit" not in state_dict:
            raise ValueError("not a 1-bit Adam state dict: no 'onebit' entry (the step "
                             "count and the error feedback); it was saved from another "
                             "optimizer")
        onebit = state_dict["onebit"]
        params = [p for g in self.param_groups for p in g["params"]]
        world = dist.get_world_size(self.group)
        errors, laid_out = {}, {}
        for g, saved in onebit["errors"].items():
            g = int(g)
            if not 0 <= g < len(self.param_groups):
                raise ValueError(f"1-bit Adam's state dict has error feedback for param "
                                 f"group {g}; this optimizer has {len(self.param_groups)}")
            ps = [params[int(i)] for i in saved["params"]]
            want = new_errors(sum(p.data.size for p in ps), world, ps[0].data.dtype)
            if saved["worker"].shape != want.worker.shape or \
                    saved["server"].shape != want.server.shape:
                raise ValueError(
                    f"1-bit Adam's error feedback of param group {g} was saved at another "
                    f"world size (server error {tuple(saved['server'].shape)}, this world "
                    f"of {world} needs {tuple(want.server.shape)}): resume at the same "
                    f"world size")
            errors[g] = OneBitErrors(backend.from_host(saved["worker"]).astype(
                want.worker.dtype, copy=True), backend.from_host(saved["server"]).astype(
                want.server.dtype, copy=True))
            laid_out[g] = [id(p) for p in ps]
        for g in onebit.get("empty", []):        # (not in a state dict saved before it)
            laid_out[int(g)] = []
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "onebit"})
        self.steps = int(onebit["steps"])
        self.frozen = self.steps >= self.freeze_step
        self.errors, self._laid_out = errors, laid_out

    def _errors_of(self, index: int, group: dict, params: list) -> OneBitErrors | None:
        """The group's flat error buffers (None when it has no gradient), made at its first
        compressed step, on every rank at once, once the ranks agree on the parameters
        they lay them out over (onebit_layout.py)."""
        if index not in self._laid_out:
            self._laid_out[index] = agree_on_layout(index, group, params, self.group)
            if params:
                n = sum(p.data.size for p in params)
                self.errors[index] = new_errors(n, dist.get_world_size(self.group),
                                                params[0].data.dtype)
        return self.errors.get(index)
