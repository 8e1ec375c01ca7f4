"""``Optimizer``: the bookkeeping every optimizer shares (param groups, state).

An optimizer owns two things, laid out as in PyTorch:

- ``param_groups``: a list of dicts. Each holds ``'params'`` (a list of
  Tensors) and that group's hyperparameters (``'lr'``, ``'weight_decay'``, ...).
  A learning-rate schedule changes training by writing ``group['lr']``.
- ``state``: a dict from parameter Tensor to that parameter's buffers
  (``{'step': 3, 'exp_avg': array, ...}``), created lazily on its first step.

The arithmetic lives elsewhere: each optimizer file has a plain function over
arrays (``sgd_update``, ``adamw_update``, ...) that updates one parameter in
place. ``step()`` only walks the groups and calls it. ZeRO calls the same
functions on flat shards of parameters, so the math is written once. An optimizer
that needs a param group whole (1-bit Adam's one compressed all-reduce of the flat
momentum) writes ``_update_group`` instead of the per-parameter ``_update``.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Iterable

from minidist import backend
from minidist.autograd import Tensor, enable_grad
from minidist.autograd.tensor import RemovableHandle
from minidist.trace import recorder as trace


def check_non_negative(**hyperparameters: float) -> None:
    """Raise ValueError naming the first hyperparameter below 0 (lr, momentum, ...)."""
    for name, value in hyperparameters.items():
        if value < 0:
            label = "learning rate" if name == "lr" else name
            raise ValueError(f"invalid {label}: {value} (must be >= 0)")


class Optimizer:
    """Base class: holds ``param_groups`` and ``state``; subclasses write ``step``.

    ``params`` is an iterable of Tensors, or of dicts ``{'params': [...], 'lr': ...}``
    (one param group each; keys left out take the values in ``defaults``).
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        if isinstance(params, Tensor):
            raise TypeError("params should be an iterable of Tensors (or of param-group "
                            "dicts), not a single Tensor; wrap it in a list")
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Any]] = {}
        self._step_pre_hooks: list[Callable] = []     # hook(optimizer, args, kwargs)
        self._step_post_hooks: list[Callable] = []    # run after each step(), in order
        self._step_skipped_hooks: list[Callable] = [] # run by skip_step(), in order
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group of parameters, filling missing hyperparameters from ``defaults``."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("a param group is a dict with a 'params' key")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor (it was made by an op)")
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ValueError(f"unknown hyperparameter(s) {sorted(unknown)} for "
                             f"{type(self).__name__}; known: {sorted(self.defaults)}")
        # A parameter updated by two groups would take two steps per step().
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError("a parameter appears more than once across param groups")
        full = dict(self.defaults)
        full.update(group)
        full["params"] = params
        self.param_groups.append(full)

    # -- step hooks: the extension point for wrappers like DiLoCo --------------
    def register_step_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(optimizer, args, kwargs)`` at the start of every ``step()``
        (torch's signature); ``handle.remove()`` takes it off."""
        self._step_pre_hooks.append(hook)
        return RemovableHandle(self._step_pre_hooks, hook)

    def register_step_post_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(optimizer, args, kwargs)`` at the end of every ``step()``, after
        the parameters were updated: what it does to them is what ``step()`` leaves."""
        self._step_post_hooks.append(hook)
        return RemovableHandle(self._step_post_hooks, hook)

    def register_step_skipped_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(optimizer, args, kwargs)`` at every ``skip_step()``: an iteration
        whose step was not taken (GradScaler's step on an inf / NaN gradient). A wrapper
        that counts iterations (DiLoCo's schedule) registers here beside its post hook."""
        self._step_skipped_hooks.append(hook)
        return RemovableHandle(self._step_skipped_hooks, hook)

    def skip_step(self, *args: Any, **kwargs: Any) -> None:
        """Say that this iteration's ``step(*args, **kwargs)`` is not taken: nothing is
        updated; the step-skipped hooks run."""
        for hook in list(self._step_skipped_hooks):
            hook(self, args, kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient: to ``None`` (default) or to zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad[...] = 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update every parameter that has a gradient; returns ``closure()`` if given.

        The closure (recompute the loss and call backward) is run first, with
        gradients enabled, as in PyTorch.
        """
        for hook in list(self._step_pre_hooks):
            hook(self, (closure,), {})
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        start = trace.active.now() if trace.active is not None else 0.0
        for group in self.param_groups:
            # A parameter unused in this forward has no gradient: leave it and its
            # state alone, exactly as PyTorch does.
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.shape != p.data.shape or p.grad.dtype != p.data.dtype:
                    # In-place updates would silently cast a float64 gradient into a
                    # float32 parameter; mixed precision casts explicitly, before this.
                    raise ValueError(f"gradient {tuple(p.grad.shape)} {p.grad.dtype} does not "
                                     f"match parameter {tuple(p.data.shape)} {p.data.dtype}")
            self._update_group(group, params)
        if trace.active is not None:   # the step's span (trace/)
            trace.active.span(f"{type(self).__name__}.step", "optim", start, trace.active.now())
        for hook in list(self._step_post_hooks):
            hook(self, (closure,), {})
        return loss

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        """Update a group's parameters that have a gradient (``params``, in the group's
        order): one at a time here. An optimizer that needs the group whole (1-bit
        Adam's one compressed all-reduce of the flat momentum) writes this instead."""
        for p in params:
            self._update(p, group, self.state.setdefault(p, {}))

    def _update(self, p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        """Update one parameter in place (``p.data``) from ``p.grad``; subclasses write it."""
        raise NotImplementedError

    # -- saving and restoring -------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{'state': {index: {...}}, 'param_groups': [{..., 'params': [indices]}]}``.

        Parameters are numbered in order across groups, as in PyTorch. The arrays
        are the live buffers, not copies (also as in PyTorch): ``copy.deepcopy``
        the result to keep a snapshot while training goes on.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = ids
            groups.append(saved)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = dict(self.state[p])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyperparameters and buffers saved by ``state_dict()`` (arrays are copied).

        The optimizer must have been built over parameters of the same shapes, in
        the same groups; anything else raises ``ValueError`` naming the mismatch.
        """
        if set(state_dict) != {"state", "param_groups"}:
            raise ValueError(f"not an optimizer state dict: keys {sorted(state_dict)}, "
                             "expected ['param_groups', 'state']")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"state dict has {len(saved_groups)} param groups, "
                             f"this optimizer has {len(self.param_groups)}")
        by_index: dict[int, Tensor] = {}
        for g, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"param group {g}: state dict has {len(saved['params'])} "
                                 f"parameters, this optimizer has {len(group['params'])}")
            by_index.update(zip(saved["params"], group["params"]))
        new_state: dict[Tensor, dict[str, Any]] = {}
        for i, buffers in state_dict["state"].items():
            if i not in by_index:
                raise ValueError(f"state dict has state for parameter {i}, "
                                 "which no param group lists")
            p = by_index[i]
            new_state[p] = {k: _load_value(k, v, p, i) for k, v in buffers.items()}
        # Only change anything once everything has been checked.
        self.state = new_state
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for g, group in enumerate(self.param_groups):
            hyper = ", ".join(f"{k}={v}" for k, v in group.items() if k != "params")
            lines.append(f"  group {g}: {len(group['params'])} params, {hyper}")
        return "\n".join(lines + [")"])


def _load_value(name: str, value: Any, p: Tensor, index: int) -> Any:
    """Copy one saved buffer onto the active backend, checking it fits parameter ``p``."""
    if isinstance(value, numbers.Integral):     # 'step' (maybe a NumPy int from a file)
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if not backend.is_array(value):
        value = backend.from_host(value)  # e.g. a NumPy array read from a checkpoint
    if value.shape != p.data.shape:
        raise ValueError(f"state '{name}' of parameter {index} has shape {tuple(value.shape)}, "
                         f"the parameter has shape {tuple(p.data.shape)}")
    # A copy, so the loaded optimizer never writes into the caller's dict.
    return value.astype(p.data.dtype, copy=True)


def optimizer_bytes(optimizer: Any, model_params: Iterable[Any] = ()) -> int:
    """Bytes of the optimizer's state arrays, plus parameter arrays it owns that are
    not the model's (a float32 master copy counts as optimizer state, as in ZeRO)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "nbytes"):
                total += value.nbytes
    model = {id(p) for p in model_params}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in model:
                total += p.data.nbytes
    return total
