"""A communication hook's memory, saved with the checkpoint and healed from a peer.

Hooks with error feedback (PowerSGD, Top-K) carry memory from step to step: each
bucket's residual, PowerSGD's warm-start Q and its step counter. A run resumed
without it restarts the error feedback (and PowerSGD its warm-up) and parts from
the uninterrupted run. So their states save it, two ways:

    state.state_dict()       every field but the process group, as plain data:
                             {"density": 0.01, ..., "error_dict": {bucket: (n,)}}
                             (what minidist's checkpoint and the healing buffer of
                             fault_tolerance/pack.py carry: dicts, lists, arrays, scalars)
    state.load_state_dict(d) the fields back; each array a copy on the active backend
    pickle.dumps(state)      torch's PowerSGDState surface: ``__getstate__`` leaves the
                             process group out (it cannot travel), ``__setstate__``
                             puts back None, the world (set ``state.process_group``
                             after loading for another group)

The residuals are this rank's own: save one file per rank
(``save_file(f"ckpt/rank{r}.npz", {..., "hook": state.state_dict()})``) and load
each rank its own, with the same bucketing (a residual of another size than its
bucket is refused when the hook adds it, naming the bucket).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from minidist import backend


class HookState:
    """The saving surface shared by the hooks' state dataclasses (module docstring)."""

    def state_dict(self) -> dict[str, Any]:
        """Every field but ``process_group``; dicts copied (their arrays are the live
        ones, as a model's state dict gives its parameters)."""
        return {name: dict(value) if isinstance(value, dict) else value
                for name, value in self._saved_fields()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The fields ``state_dict`` gave, each array copied onto the active backend."""
        names = [name for name, _ in self._saved_fields()]
        missing = [name for name in names if name not in state_dict]
        if missing:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state dict has no "
                             f"{missing}: it was saved from another hook's state")
        for name in names:
            value = state_dict[name]
            setattr(self, name, _owned_memory(value) if isinstance(value, dict) else value)

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in vars(self).items() if name != "process_group"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.process_group = None               # the world, as torch's default group

    def _saved_fields(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if f.name != "process_group"]


def _owned_memory(saved: dict) -> dict:
    """bucket index -> array or [arrays], copied (nothing aliases what was loaded); the
    index an int again (a file format may have kept it as a string)."""
    return {int(i) if isinstance(i, str) and i.isdigit() else i: _owned(v)
            for i, v in saved.items()}


def _owned(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_owned(v) for v in value]
    if backend.is_array(value):
        return value.copy()
    return value


def add_residual(error_dict: dict, index: int, buf: Any) -> None:
    """Error feedback's input = gradient + residual, in place on ``buf`` (n,), if bucket
    ``index`` has a residual. One of another size (a state saved with another
    bucketing) is refused: added, it would broadcast or fail without a word on why."""
    residual = error_dict.get(index)
    if residual is None:
        return
    if residual.shape != buf.shape:
        raise ValueError(f"the error-feedback residual of bucket {index} has shape "
                         f"{tuple(residual.shape)}, the bucket {tuple(buf.shape)}: the hook's "
                         f"state was saved from a model bucketed differently (another "
                         f"bucket_cap_mb, or other parameters)")
    buf += residual
