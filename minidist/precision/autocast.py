"""Autocast: matmul-like ops compute on low-precision inputs, the rest in float32.

Inside ``with autocast("bf16"):`` (or "fp16"), every matmul-like op of ``nn``
(linear, and the two products of attention, q k^T and att v) goes through
``autocast_matmul``, which emulates what a tensor-core GEMM does under PyTorch's
AMP:

    forward:   y = round(op(round(a), round(b), ...))     products summed in float32
    backward:  dL/dy <- round(dL/dy);  dL/da <- round(dL/da), ...

``round`` is ``quantize(., fmt)``. The products of two fp16 / bf16 values are
exact in float32 and the sums are float32, as in the hardware; the output and
the op's gradients are rounded once, as the op writes them in the low format.
Softmax, layer norm, reductions and the loss see float32 arrays (holding fp16
values) and compute in float32: AMP's list of "float32 ops".

The straight-through ``Round`` op below is the whole mechanism: forward rounds,
backward rounds the gradient (or passes it through). FP8 (``precision.fp8``)
plugs in its own policy with scaled casts.

The active policy is a context, not a global reached from everywhere: only
``autocast_matmul`` reads it, and ``nn.functional`` is its only caller.

A forward recomputed in backward (activation checkpointing, ZeRO-3) runs after
its ``with`` block has closed. ``capture_policy`` takes the policy active at
forward time and re-enters it around the recompute (registered with autograd's
extension point, autograd/recompute.py, as PyTorch's checkpoint saves the
autocast state). A policy with state per call (an FP8 recipe numbers its sites)
gets ``replay_mark()`` at capture and ``begin_replay(mark)`` / ``end_replay()``
around the recompute, so that it runs as the one forward did.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist.autograd.function import Function
from minidist.autograd.recompute import register_recompute_context
from minidist.autograd.tensor import Tensor
from minidist.precision.formats import FloatFormat, get_format
from minidist.precision.rounding import quantize

_active: dict[str, Any] = {"policy": None}


class Round(Function):
    """y = fwd(x); dL/dx = bwd(dL/dy). ``None`` for either means the identity."""

    @staticmethod
    def forward(ctx, x, fwd=None, bwd=None):
        ctx.bwd = bwd
        return x if fwd is None else fwd(x)

    @staticmethod
    def backward(ctx, grad):
        return grad if ctx.bwd is None else ctx.bwd(grad)


class AmpPolicy:
    """Round inputs, output and gradients of matmul-like ops to ``fmt`` (fp16 / bf16).

    ``round_forward`` / ``round_backward`` are the two roundings; a subclass may
    override them, e.g. to count the gradient values that underflow (demo 09).
    """

    def __init__(self, fmt: FloatFormat | str):
        self.fmt = get_format(fmt)

    def round_forward(self, a: Any) -> Any:
        return quantize(a, self.fmt)

    def round_backward(self, grad: Any) -> Any:
        return quantize(grad, self.fmt)

    def run(self, fn: Callable, args: tuple) -> Tensor:
        fwd, bwd = self.round_forward, self.round_backward
        low = [Round.apply(a, fwd=fwd, bwd=bwd) if isinstance(a, Tensor) else a for a in args]
        return Round.apply(fn(*low), fwd=fwd, bwd=bwd)


def autocast_matmul(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """``fn(*args)`` under the active autocast policy; just ``fn(*args)`` outside one.

    ``fn`` is a matmul-like op of tensors (``Linear.apply``, ``operator.matmul``);
    non-Tensor arguments (a ``None`` bias) pass through untouched.
    """
    policy = _active["policy"]
    if policy is None:
        return fn(*args)
    return policy.run(fn, args)


class use_policy:
    """Context manager that makes ``policy`` (or none) active and restores the previous one."""

    def __init__(self, policy: Any):
        self.policy = policy

    def __enter__(self) -> Any:
        self._previous = _active["policy"]
        _active["policy"] = self.policy
        return self.policy

    def __exit__(self, *exc: Any) -> None:
        _active["policy"] = self._previous


class autocast(use_policy):
    """``with autocast("fp16"):`` runs matmul-like ops in fp16 (see the module docstring).

    ``dtype``: a format or its name ("bf16", "fp16", any ``FloatFormat``);
    ``enabled=False`` turns autocast off inside the block (as in PyTorch).
    """

    def __init__(self, dtype: FloatFormat | str = "bf16", enabled: bool = True):
        self.fmt = get_format(dtype)
        super().__init__(AmpPolicy(self.fmt) if enabled else None)


def get_autocast_policy() -> Any:
    """The active policy (``AmpPolicy``, an FP8 recipe) or None."""
    return _active["policy"]


class PolicySnapshot:
    """The policy active when it was taken; ``with`` it re-enters that policy for a recompute.

    Entering makes the captured policy active (through the same switch as
    ``use_policy``, without ``begin_step``: a recompute is not a new step) and, for
    a policy that keeps per-call state, replays from the captured mark.
    """

    def __init__(self) -> None:
        self.policy = _active["policy"]
        replay = getattr(self.policy, "replay_mark", None)
        self.mark = replay() if replay is not None else None

    def __enter__(self) -> Any:
        self._previous = _active["policy"]
        _active["policy"] = self.policy
        if self.mark is not None:
            try:
                self.policy.begin_replay(self.mark)
            except BaseException:
                _active["policy"] = self._previous
                raise
        return self.policy

    def __exit__(self, *exc: Any) -> None:
        if self.mark is not None:
            self.policy.end_replay()
        _active["policy"] = self._previous


@register_recompute_context
def capture_policy() -> PolicySnapshot:
    """The active autocast / FP8 / block-scaling policy, to re-enter around a recompute."""
    return PolicySnapshot()
