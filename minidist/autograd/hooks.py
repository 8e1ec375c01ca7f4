"""An identity whose backward calls a hook: where code outside the autograd learns
that a tensor's gradient is complete (torch's ``BackwardHookFunction``, what a
module's full backward hooks are made of).

    y = on_gradient(x, hook)      forward:  y = x             (the same array)
                                  backward: hook();  dL/dx = dL/dy

The hook runs when dL/dy is complete: after every op that used ``y`` has run
its backward. Put on a module's inputs, that is the end of the module's backward;
on its outputs, its start (nn/module_trace.py). A node's own hooks
(``Context.register_prehook`` / ``register_hook``, function.py) time one op instead.
"""
from __future__ import annotations

from typing import Callable

from minidist.autograd.function import Context, Function
from minidist.autograd.tensor import Tensor


class BackwardHook(Function):
    """y = x; its backward calls ``ctx.hook()`` and passes dL/dy on unchanged."""

    @staticmethod
    def forward(ctx, x, hook: Callable[[], None] = None):
        ctx.hook = hook
        return x                                     # the same array: nothing is copied

    @staticmethod
    def backward(ctx, grad):
        ctx.hook()
        return grad


def on_gradient(x: Tensor, hook: Callable[[], None]) -> Tensor:
    """``BackwardHook.apply(x, hook=hook)`` for a tensor ``x`` that wants a gradient:
    the same node, made without ``apply``'s checks of every argument, and outside a
    selective checkpoint's record (a trace puts four on each module call, and
    recording is meant to change no op of the model)."""
    ctx = Context()
    ctx.fn, ctx.hook, ctx.n_outputs = BackwardHook, hook, 1
    ctx.needs_input_grad, ctx.inputs = (True,), (x,)
    return Tensor._from_op(x.data, ctx, 0)
