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
gradient to the same parameters: the warm-up's all-reduce carries, before the flat
gradient, each rank's mask of the group's P parameters (1 where it has a gradient), and
an average strictly between 0 and 1 is refused on every rank (P numbers more, no
message more); the compression stage checks the mask once, in one all-reduce at its
first step; after it a rank whose parameters with a gradient are not those any more
refuses the step's compressed all-reduce (a negative scale where its scale goes, no
byte more: onebit.py), so that every rank raises at once, and on that path only the
ranks gather their masks, so that each names the parameter and the rank.
The error feedback is laid out over that flat vector: ``errors``
holds, per param group, one worker error (n',) and one server error (n'/N,), n'
being n padded as onebit.py needs.

Adam's variance settles early in training; once frozen, Adam is a momentum SGD
with a fixed per-coordinate step size, and momentum SGD tolerates 1-bit compression
with error feedback. The bytes of the compression stage are about 1/32 of the
warm-up's (``minidist calc diloco`` counts both).

Saving: ``state_dict()`` holds, beside Adam's buffers, the step count (whether the
variance is frozen yet) and this rank's error feedback under ``'onebit'``, so that a run
saved and loaded mid-way takes the uninterrupted run's steps bit for bit. The worker
error is this rank's own: save one file per rank (``save_checkpoint(...,
rank0_only=False)``) and load each rank its own, at the same world size. (DeepSpeed
drops the errors on load instead and restarts the feedback from zero.)

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


def flatten(arrays: list[Any]) -> Any:
    """The arrays back to back in one new flat vector (n,), of their one dtype."""
    dtypes = {str(a.dtype) for a in arrays}
    if len(dtypes) != 1:
        raise ValueError(f"1-bit Adam flattens each param group into one vector of one "
                         f"dtype, got {sorted(dtypes)}: put the parameters of each dtype "
                         f"in a param group of their own")
    return xp.concatenate([a.reshape(-1) for a in arrays])


def views(flat: Any, like: list[Any]) -> list[Any]:
    """Pieces of ``flat`` shaped like the arrays of ``like``, in order (no copy)."""
    out, off = [], 0
    for a in like:
        out.append(flat[off:off + a.size].reshape(a.shape))
        off += a.size
    return out


def gradient_mask(group: dict, params: list) -> Any:
    """(P,) over the group's P parameters: 1 where the parameter is among ``params``
    (those with a gradient on this rank), else 0; in the group's dtype."""
    with_grad = {id(p) for p in params}
    first = group["params"][0].data
    return backend.from_host([1.0 if id(p) in with_grad else 0.0 for p in group["params"]],
                             dtype=first.dtype)


def refuse_left_out(index: int, group: dict, averaged: Any) -> None:
    """Raise, on every rank alike, if the ranks' gradient masks differ: ``averaged`` is
    their mean (the same bits everywhere), and a slot strictly between 0 and 1 is a
    parameter some ranks have a gradient for and others not. The flat vectors are
    averaged by position, so such a step would add one parameter's gradient to
    another's, silently where the sizes match."""
    left_out = [j for j, x in enumerate(backend.to_host(averaged).tolist()) if 0 < x < 1]
    if left_out:
        shapes = [tuple(group["params"][j].shape) for j in left_out]
        raise ValueError(
            f"1-bit Adam: parameters {left_out} of param group {index} (shapes {shapes}) "
            f"have a gradient on some ranks and not on others; the group's flat vector is "
            f"averaged by position, so it would pair different parameters' numbers: give "
            f"every parameter a gradient on every rank (zero_grad(set_to_none=False) "
            f"keeps them as zeros)")


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
        loss = super().step(closure)             # _update_group, once per param group
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
            if self._laid_out[index] != [id(p) for p in params]:
                self._refuse_changed_gradients(index, group, params, errors)
            local = flatten([beta1 * s["exp_avg"] + (1 - beta1) * p.grad   # (n,) m_i
                             for p, s in zip(params, states)])
            try:
                m = compressed_allreduce(local, errors, self.group)
            except Refused:                      # a peer's gradients changed: name them
                self._refuse_changed_gradients(index, group, params, errors)
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
        (n'/N,), 'params': [indices]}}}`` (live arrays, as the buffers)."""
        saved = super().state_dict()
        index = {id(p): i for i, p in enumerate(
            p for g in self.param_groups for p in g["params"])}
        errors = {g: {"worker": e.worker, "server": e.server,
                      "params": [index[i] for i in self._laid_out[g]]}
                  for g, e in self.errors.items()}
        saved["onebit"] = {"steps": self.steps, "errors": errors}
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
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "onebit"})
        self.steps = int(onebit["steps"])
        self.frozen = self.steps >= self.freeze_step
        self.errors, self._laid_out = errors, laid_out

    def _errors_of(self, index: int, group: dict, params: list) -> OneBitErrors | None:
        """The group's flat error buffers (None when it has no gradient), made at its first
        compressed step, on every rank at once: there the ranks check (one all-reduce of
        the mask) that they lay them out over the same parameters. Every later step must
        have gradients for those same ones."""
        ids = [id(p) for p in params]
        if index not in self._laid_out:
            have = gradient_mask(group, params)                             # (P,)
            dist.all_reduce(have, op=ReduceOp.AVG, group=self.group)
            refuse_left_out(index, group, have)
            self._laid_out[index] = ids
            if params:
                n = sum(p.data.size for p in params)
                self.errors[index] = new_errors(n, dist.get_world_size(self.group),
                                                params[0].data.dtype)
        elif self._laid_out[index] != ids and index not in self.errors:
            # laid out over no parameter: the group makes no collective, so this rank
            # raises alone (its peers wait at their next collective)
            me = dist.get_rank(self.group)
            raise ValueError(self._changed_message(index, group, {
                self._global(me): backend.to_host(gradient_mask(group, params)).tolist()}))
        return self.errors.get(index)

    def _refuse_changed_gradients(self, index: int, group: dict, params: list,
                                  errors: OneBitErrors) -> None:
        """Raise on every rank, naming the parameters, when some rank's gradients are not
        those the group's error feedback is laid out over. The rank that sees it refuses
        the compressed all-reduce (its peers learn it from the gathered scales, no message
        more: onebit.py), then all gather their masks (this error's path only)."""
        mine = self._laid_out[index] != [id(p) for p in params]
        if mine:
            try:
                compressed_allreduce(xp.zeros_like(errors.worker), errors, self.group,
                                     refuse=True)
            except Refused:
                pass
        have = gradient_mask(group, params)                                   # (P,)
        masks = xp.empty(dist.get_world_size(self.group) * have.size, dtype=have.dtype)
        dist.all_gather_into_tensor(masks, have, group=self.group)            # (N * P,)
        rows = backend.to_host(masks).reshape(-1, have.size).tolist()          # N x (P,)
        raise ValueError(self._changed_message(
            index, group, {self._global(r): mask for r, mask in enumerate(rows)}))

    def _global(self, rank: int) -> int:
        """The global rank of ``rank`` of the optimizer's group."""
        return rank if self.group is None else self.group.ranks[rank]

    def _changed_message(self, index: int, group: dict, masks: dict[int, list]) -> str:
        """What changed, per parameter, against the parameters the errors are laid out
        over; ``masks``: global rank -> its mask of the group's P parameters."""
        laid_out = set(self._laid_out[index])
        changes = []
        for j, p in enumerate(group["params"]):
            was = id(p) in laid_out
            now = [r for r, mask in masks.items() if bool(mask[j]) != was]
            if now:
                what = "has no gradient" if was else "has a gradient"
                changes.append(f"parameter {j} (shape {tuple(p.shape)}) {what} on "
                               f"rank(s) {now}")
        return (f"1-bit Adam: the error feedback of param group {index} is laid out over "
                f"the flat momentum of the {len(laid_out)} parameters that had a gradient "
                f"at its first compressed step, and this step's gradients differ: "
                f"{'; '.join(changes)}. Give the same parameters a gradient at every step "
                f"(zero_grad(set_to_none=False) keeps them as zeros)")
