"""A kept unit's pre-backward: its first output gradient issues the gathers of the units before it.

FSDP2 hangs a hook on every unit's forward outputs (torch's ``_register_pre_backward_hook``,
``register_multi_grad_hook(..., mode="any")``): the first gradient to reach one of them runs
the unit's ``pre_backward``, which gathers the unit's parameters again if it resharded them
and issues the backward prefetch of the unit before it in the order the forwards ended
(``post_forward_order``). Here a resharded unit gathers inside its own backward
(fully_shard.py's _ShardedUnit), so the hook matters for a unit that kept its parameters:
the root, or ``reshard_after_forward=False``. The root's forward ends after every unit
inside it, so the unit before it is the last block, and its gather travels while the
head's backward computes (state.py's ``FSDPState.pre_backward``)::

    main thread  | loss, head backward | b1: recompute, backward | b0: ...
    comm thread    [AG b1 ~~wire~~]      [AG b0 ~~wire~~]
                   ^ issued by the root's pre-backward, not at b1's backward
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.function import Function
from minidist.autograd.grad_mode import is_grad_enabled
from minidist.autograd.tensor import Tensor
from minidist.distributed.tensor._collectives import backward_phase


class PreBackward(Function):
    """y = x; backward: the unit's pre-backward (``state.pre_backward()``: the gathers of
    the units before it issued), then the gradient unchanged."""

    @staticmethod
    def forward(ctx, x, state=None):
        ctx.state = state
        return x

    @staticmethod
    def backward(ctx, grad):
        with backward_phase():              # the gathers it issues are the backward's
            ctx.state.pre_backward()
        return grad


def with_pre_backward(out: Any, state: Any) -> Any:
    """``out`` (a Tensor, or a tuple / list holding some) with each Tensor that a backward
    will reach passed through PreBackward; the first to get its gradient fires it (a second
    finds the gathers under way or done: ``prefetch_targets`` leaves those out)."""
    def hooked(value: Any) -> Any:
        if type(value) is Tensor and value.requires_grad and is_grad_enabled():
            return PreBackward.apply(value, state=state)
        return value
    if type(out) in (tuple, list):
        return type(out)(hooked(value) for value in out)
    return hooked(out)
