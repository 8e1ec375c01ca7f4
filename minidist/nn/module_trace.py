"""A module's forward and backward as spans of a trace (minidist/trace/), by dotted name.

``Module.__call__`` hands over to ``traced_call`` while a trace is recorded.
The forward is a span around ``forward``. The backward has no call of its own
to wrap (the engine runs the ops' backwards one by one), so two identity ops
mark its ends, as torch's full backward hooks do:

    x' = Mark(x)   for each input that wants a gradient: its backward is the *last*
                   thing of the module's backward (dL/dx is complete)
    y' = Mark(y)   for each output that wants a gradient: its backward is the *first*
                   (dL/dy has arrived)

    backward span of the module = [first output mark, last input mark]

A module whose inputs want no gradient (the embedding of token ids, the outermost
GPT) has no end mark and so no backward span; its children have theirs. Nor has
a leaf without parameters (Dropout, GELU): its backward is one op.
Nothing here runs unless a trace is being recorded.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist.autograd import grad_mode
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.trace import recorder as trace


class Mark(Function):
    """y = x; its backward calls ``note()`` and passes dL/dy on unchanged."""

    @staticmethod
    def forward(ctx, x, note: Callable[[], None] = None):
        ctx.note = note
        return x                                     # the same array: nothing is copied

    @staticmethod
    def backward(ctx, grad):
        ctx.note()
        return grad


class _Backward:
    """The two ends of one call's backward, noted by its marks."""

    def __init__(self, name: str, inputs: int):
        self.name, self.inputs, self.start = name, inputs, None

    def output_grad(self) -> None:
        if self.start is None and trace.active is not None:
            self.start = trace.active.now()

    def input_grad(self) -> None:
        self.inputs -= 1
        if self.inputs == 0 and self.start is not None and trace.active is not None:
            trace.active.span(f"{self.name} backward", "module", self.start, trace.active.now())


def _wants_grad(a: Any) -> bool:
    return isinstance(a, Tensor) and a.requires_grad


def traced_call(module: Any, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` with its forward span and backward marks."""
    rec = trace.active
    name = rec.enter_module(module)
    # (a leaf without parameters, Dropout or GELU, gets its forward span only: its
    # backward is one op, and marks cost two autograd nodes per call)
    marking = grad_mode.is_grad_enabled() and bool(module._parameters or module._modules)
    back = _Backward(name, sum(_wants_grad(a) for a in args)) if marking else None
    if back is not None and back.inputs:
        args = tuple(Mark.apply(a, note=back.input_grad) if _wants_grad(a) else a for a in args)
    start = rec.now()
    try:
        out = module.forward(*args, **kwargs)
    finally:
        rec.exit_module()
        rec.span(name, "module", start, rec.now(), {"module": type(module).__name__})
    if back is None or not back.inputs:
        return out
    if isinstance(out, tuple):
        return tuple(Mark.apply(o, note=back.output_grad) if _wants_grad(o) else o for o in out)
    return Mark.apply(out, note=back.output_grad) if _wants_grad(out) else out
