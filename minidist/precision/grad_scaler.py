"""``GradScaler``: dynamic loss scaling for fp16 training, with PyTorch's semantics.

fp16 flushes gradients below 2^-24 ~ 6e-8 to zero. Multiplying the loss by a
scale S multiplies every gradient by S (the chain rule is linear), lifting the
small ones into range; the optimizer must then see g / S. S is adapted:

    S_0 = 2^16
    after each step:  some gradient inf / NaN  ->  skip the step, S <- S * 0.5, good = 0
                      else good += 1; if good == 2000: S <- S * 2 (if finite), good = 0

The loop reads like PyTorch's::

    scaler = GradScaler()
    scaler.scale(loss).backward()   # gradients of S * loss
    scaler.unscale_(opt)            # optional: g <- g / S now (e.g. to clip them)
    scaler.step(opt)                # unscale if not yet done; opt.step() unless inf / NaN
    scaler.update()                 # adapt S

S is a float32 scalar, 1/S is computed in float64 then rounded to float32, and
S * factor in float64 then float32: what ``torch.amp.GradScaler`` does, so the
two give the same scale trajectory and skip the same steps.

Across ranks (ZeRO, sharded gradients) each rank only sees its own gradients, so
all must agree on "found inf" or they would step differently. Pass
``found_inf_reduce``: a callable taking the local flag (a 0-d float32 array,
1.0 if this rank found inf / NaN) and returning the flag combined over ranks:
``minidist.parallel.found_inf_reduce(group)``, the MAX over the group. It runs in
``unscale_``.
Parameters that ``fully_shard`` or ``parallelize_module`` cut need none: their
flag is max-combined over the ranks holding the other pieces (autograd/pieces.py),
as torch's GradScaler does for DTensor gradients; nor do a pipeline's stages, whose
flag ``run_pipeline`` has max-combined over the pipeline group (autograd/pieces.py), so
no stage steps while another skips. Nor does an optimizer that sends
each rank's own gradients itself (1-bit Adam: no DDP averaged them, so one rank's
inf is that rank's alone): it says so with a method ``combine_found_inf(flag)``,
which ``unscale_`` calls, as DeepSpeed's engine max-reduces its overflow flag.

A skipped step calls the optimizer's ``skip_step()`` (optim/optimizer.py), where it
has one, so that a wrapper counting iterations by the optimizer's steps (DiLoCo
synchronises every H of them) counts the skipped one too and its replicas, each of
which may skip on its own, stay in step.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from minidist.autograd.pieces import piece_kinds, stage_kinds
from minidist import backend
from minidist.backend import xp
from minidist.precision.rounding import quiet
from minidist.precision.subnormals import narrow, widen

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True,
                 found_inf_reduce: Callable[[Any], Any] | None = None):
        if growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        self._enabled = enabled
        self._growth_factor, self._backoff_factor = growth_factor, backoff_factor
        self._growth_interval = growth_interval
        self._scale = _f32(init_scale)
        self._growth_tracker = 0                 # clean steps since the last change of S
        self._found_inf_reduce = found_inf_reduce
        self._per_optimizer: dict[int, dict[str, Any]] = {}

    # -- the four verbs ----------------------------------------------------------
    def scale(self, outputs: Any) -> Any:
        """outputs * S (a Tensor, an array, or a list / tuple of them)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return outputs * self._scale.astype(outputs.dtype)

    def unscale_(self, optimizer: Any) -> None:
        """g <- g * (1/S) for the optimizer's gradients; note whether any was inf / NaN."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer "
                               "since the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = widen(narrow(widen(self._scale) ** -1))   # 1/S rounded to float32, as float64
        found_inf = xp.zeros((), dtype=xp.float32)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for p in params:
            if p.grad is None:
                continue
            bad = ~xp.isfinite(p.grad).all()
            found_inf = xp.maximum(found_inf, bad.astype(xp.float32))
            if p.grad.dtype == xp.float32 and backend.flushes_subnormals():
                p.grad[...] = narrow(widen(p.grad) * inv_scale)   # 1/S above 2^126 is subnormal
            else:
                p.grad *= inv_scale.astype(p.grad.dtype)
        kinds = [layout for layout, _ in piece_kinds(params)[1]]   # pieces: holders agree
        for layout in kinds + stage_kinds(params):   # then a pipeline's stages, together
            found_inf = xp.asarray(layout.combine(float(found_inf), math.inf), dtype=xp.float32)
        combine = getattr(optimizer, "combine_found_inf", None)
        if combine is not None:     # an optimizer that sends rank-local gradients itself
            found_inf = combine(found_inf)
        if self._found_inf_reduce is not None:
            found_inf = self._found_inf_reduce(found_inf)
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless a gradient was inf / NaN (then nothing changes)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None
        if float(state["found_inf"]) == 0.0:
            result = optimizer.step(*args, **kwargs)
        else:            # the hooks that count iterations (DiLoCo's) count this one too
            skip = getattr(optimizer, "skip_step", None)
            if skip is not None:
                skip(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale: float | Any | None = None) -> None:
        """Adapt S after the step (back off on inf / NaN, grow after a clean interval)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _f32(float(new_scale))
        else:
            flags = [s["found_inf"] for s in self._per_optimizer.values() if "found_inf" in s]
            if not flags:
                raise RuntimeError("No inf checks were recorded prior to update(): "
                                   "call step() (or unscale_()) first.")
            if any(float(f) != 0.0 for f in flags):
                self._scale = _f32(float(self._scale) * self._backoff_factor)
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    grown = _f32(float(self._scale) * self._growth_factor)
                    if bool(xp.isfinite(grown)):      # never grow to inf
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer.clear()

    # -- inspection and checkpoints --------------------------------------------
    def get_scale(self) -> float:
        return float(self._scale) if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def found_inf_reduce(self) -> Callable[[Any], Any] | None:
        """How the found-inf flag is combined over ranks (None: this rank alone)."""
        return self._found_inf_reduce

    def state_dict(self) -> dict[str, Any]:
        """The keys of ``torch.amp.GradScaler.state_dict()``; empty when disabled."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("The source state dict is empty, possibly because it was "
                               "saved from a disabled instance of GradScaler.")
        self._scale = _f32(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])

    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY})


def _f32(value: float) -> Any:
    """A Python float (a float64) rounded once to a 0-d float32 array (inf if too big)."""
    with quiet():
        return narrow(xp.asarray(value, dtype=xp.float64))
