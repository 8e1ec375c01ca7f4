"""Learning-rate schedules and the batch-size scaling rules.

Warmup then cosine decay, for step s = 0, 1, 2, ... (W warmup steps, T total):

    lr(s) = base_lr * (s + 1) / W                                   s < W
    lr(s) = min_lr + (base_lr - min_lr) * (1 + cos(pi * q)) / 2,    W <= s < T,
            q = (s - W) / (T - W)                                   (0 -> 1)
    lr(s) = min_lr                                                  s >= T

The warmup starts near 0 (base_lr / W, not 0, so the first step is not
wasted) and reaches base_lr at s = W - 1; the cosine starts from base_lr at
s = W, passes (base_lr + min_lr) / 2 halfway, and lands on min_lr at s = T.

Scaling the batch from B to kB (Goyal et al. 2017; Hoffer et al. 2017):

    linear rule:  lr_new = lr_base * k           (k = B_new / B_base)
    sqrt rule:    lr_new = lr_base * sqrt(k)
    warmup:       W = k * 1000 steps             (a rule of thumb)

e.g. 3e-4 at batch 256 -> batch 2048 (k = 8): linear 2.4e-3, sqrt 8.49e-4,
warmup 8000 steps.

A scheduler object writes ``group['lr']`` into each param group of an
optimizer on every ``scheduler.step()``, called after ``optimizer.step()``,
as in PyTorch.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from minidist.optim.optimizer import Optimizer


def warmup_cosine(step: int, base_lr: float, warmup_steps: int, total_steps: int,
                  min_lr: float = 0.0) -> float:
    """The learning rate at ``step`` under linear warmup then cosine decay (formula above)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0 or total_steps < warmup_steps:
        raise ValueError(f"need 0 <= warmup_steps <= total_steps, got warmup_steps="
                         f"{warmup_steps}, total_steps={total_steps}")
    if not 0 <= min_lr <= base_lr:
        raise ValueError(f"need 0 <= min_lr <= base_lr, got min_lr={min_lr}, "
                         f"base_lr={base_lr}")
    if step < warmup_steps:
        return base_lr * ((step + 1) / warmup_steps)      # exactly base_lr at step W - 1
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _check_batches(base_batch: int, new_batch: int) -> float:
    if base_batch <= 0 or new_batch <= 0:
        raise ValueError(f"batch sizes must be positive, got base_batch={base_batch}, "
                         f"new_batch={new_batch}")
    return new_batch / base_batch


def linear_scaled_lr(base_lr: float, base_batch: int, new_batch: int) -> float:
    """Linear scaling rule: lr * (new_batch / base_batch)."""
    return base_lr * _check_batches(base_batch, new_batch)


def sqrt_scaled_lr(base_lr: float, base_batch: int, new_batch: int) -> float:
    """Square-root scaling rule: lr * sqrt(new_batch / base_batch)."""
    return base_lr * math.sqrt(_check_batches(base_batch, new_batch))


def warmup_steps_for(base_batch: int, new_batch: int, per_unit: int = 1000) -> int:
    """Rule-of-thumb warmup length: (new_batch / base_batch) * per_unit steps, rounded."""
    return round(_check_batches(base_batch, new_batch) * per_unit)


def check_optimizer(optimizer: Any) -> None:
    """Raise unless ``optimizer`` is a minidist Optimizer; a wrapper that holds one (ZeRO's
    ``Zero1/2/3``, whose ``optimizer`` steps the shards) is told to pass that."""
    if isinstance(optimizer, Optimizer):
        return
    name = type(optimizer).__name__
    inner = getattr(optimizer, "optimizer", None)
    hint = (f": pass its optimizer ({name}(...).optimizer, the {type(inner).__name__} that "
            "steps the shards), whose param_groups hold the learning rate"
            if isinstance(inner, Optimizer) else "")
    raise TypeError(f"an LR scheduler needs a minidist Optimizer, got {name}{hint}")


class LRScheduler:
    """Base class: sets every param group's ``'lr'`` from a rule of the step count.

    On construction each group's current lr is saved as ``'initial_lr'`` (the
    base), and the lr for step 0 is applied at once. ``last_epoch`` (PyTorch's
    name) counts ``scheduler.step()`` calls; subclasses write ``lr_at(step, base)``.
    """

    def __init__(self, optimizer: Optimizer):
        check_optimizer(optimizer)
        self.optimizer = optimizer
        # setdefault: a second scheduler on the same optimizer keeps the first's base.
        self.base_lrs = [group.setdefault("initial_lr", group["lr"])
                         for group in optimizer.param_groups]
        self.last_epoch = -1
        self.step()

    def lr_at(self, step: int, base_lr: float, group_index: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        """Advance one step and write the new lr into each param group."""
        self.last_epoch += 1
        for i, (group, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            group["lr"] = self.lr_at(self.last_epoch, base, i)

    def get_last_lr(self) -> list[float]:
        """The lr each group got at the last ``step()``."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if len(state_dict["base_lrs"]) != len(self.base_lrs):
            raise ValueError(f"scheduler state has {len(state_dict['base_lrs'])} base lrs, "
                             f"the optimizer has {len(self.base_lrs)} param groups")
        self.base_lrs = list(state_dict["base_lrs"])
        self.last_epoch = state_dict["last_epoch"]


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step), one lambda for all groups or one per group."""

    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Callable[[int], float] | list[Callable[[int], float]]):
        check_optimizer(optimizer)
        n = len(optimizer.param_groups)
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(lambdas) != n:
            raise ValueError(f"got {len(lambdas)} lr_lambdas for {n} param groups")
        self.lr_lambdas = lambdas
        super().__init__(optimizer)

    def lr_at(self, step: int, base_lr: float, group_index: int) -> float:
        return base_lr * self.lr_lambdas[group_index](step)


class WarmupCosine(LRScheduler):
    """Linear warmup then cosine decay to ``min_lr``, per group from its base lr."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int,
                 min_lr: float = 0.0):
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr = min_lr
        super().__init__(optimizer)

    def lr_at(self, step: int, base_lr: float, group_index: int) -> float:
        return warmup_cosine(step, base_lr, self.warmup_steps, self.total_steps, self.min_lr)
