"""What a recomputed forward must run under: the forward's context, captured and re-entered.

Activation checkpointing (activation_checkpoint.py) and ZeRO-3 (parallel/zero/zero3.py)
run a forward without a graph and run it again in backward to rebuild it. By then the
``with`` blocks the forward ran inside (an autocast region, an FP8 recipe) have closed,
so a recompute that simply called the function again would compute something else
than the forward did. PyTorch's checkpoint saves the autocast state with the inputs
and re-enters it around the recompute; this module is that idea as an extension point:

    capture = register_recompute_context(capture)    # a layer above registers once
    ctx.context = capture_forward_context()           # at forward time
    with ctx.context:                                 # around the recompute
        out = fn(*inputs)

A *capture* is a function of no arguments, called at forward time, that returns a
context manager re-entering what was active then (``precision`` registers one for
its autocast / FP8 / block-scaling policy). The autograd layer knows nothing of
what is captured: it only keeps the list.
"""
from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any, Callable, ContextManager

_captures: list[Callable[[], ContextManager]] = []
_local = threading.local()   # .depth: how many recomputes this thread runs (nested: a
                             # checkpoint in a checkpoint); per thread, as DualPipeV's F&B
                             # runs a forward beside another micro-batch's recompute


def is_recomputing() -> bool:
    """Whether a forward is running again inside backward (torch's FSDP2 asks the same
    of its checkpoint state): fully_shard then neither prefetches the next unit, which
    was already backpropagated, nor gathers its weights a third time."""
    return getattr(_local, "depth", 0) > 0


def register_recompute_context(capture: Callable[[], ContextManager]) -> Callable[[], ContextManager]:
    """Add ``capture`` (called at each checkpointed forward) to what recomputes re-enter."""
    if capture not in _captures:
        _captures.append(capture)
    return capture


class ForwardContext:
    """Every registered capture's context, taken now; ``with`` it re-enters them all."""

    def __init__(self) -> None:
        self.contexts = [capture() for capture in _captures]
        self._stack: ExitStack | None = None

    def __enter__(self) -> "ForwardContext":
        stack = ExitStack()
        try:
            for context in self.contexts:
                stack.enter_context(context)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        _local.depth = getattr(_local, "depth", 0) + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.depth -= 1
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)


def capture_forward_context() -> ForwardContext:
    """The context the current forward runs under, to re-enter around its recompute."""
    return ForwardContext()
