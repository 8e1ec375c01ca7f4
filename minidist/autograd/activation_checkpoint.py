"""Activation checkpointing: trade compute for memory.

    y = checkpoint(block, x)

Forward runs ``block`` under ``no_grad``, so none of its intermediate
activations are kept; only the inputs are saved. Backward runs ``block`` again
with the graph on (the same random state, so dropout draws the same mask;
the same precision policy, re-entered through recompute.py, so an autocast or
FP8 region that has closed by backward still rounds the recompute as it
rounded the forward), and backpropagates through that fresh graph. Gradients are the same; the
peak memory of a stack of L checkpointed blocks holds one block's
intermediates at a time instead of L.

Parameters used inside ``block`` get their gradients during the recompute,
and their post-accumulate hooks fire there. At least one input must require
grad, or the checkpoint is not part of the graph (as in PyTorch's reentrant
checkpoint).
"""
from __future__ import annotations

import warnings
from typing import Callable

from minidist import backend
from minidist.autograd.engine import backward as run_backward
from minidist.autograd.function import Function
from minidist.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from minidist.autograd.recompute import capture_forward_context
from minidist.autograd.tensor import Tensor


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx, *arrays, fn=None):
        ctx.fn_to_run = fn
        ctx.save_for_backward(*arrays)
        ctx.rng_state = backend.default_generator().get_state()
        ctx.context = capture_forward_context()   # the autocast / FP8 policy now active
        with no_grad():
            out = fn(*[Tensor(a) for a in arrays])
        return out.data

    @staticmethod
    def backward(ctx, grad):
        arrays = ctx.saved
        gen = backend.default_generator()
        state_now = gen.get_state()
        gen.set_state(ctx.rng_state)  # replay the forward's random draws
        inputs = [Tensor(a, requires_grad=need) for a, need in zip(arrays, ctx.needs_input_grad)]
        with ctx.context, enable_grad():
            out = ctx.fn_to_run(*inputs)
        gen.set_state(state_now)
        run_backward(out, grad)
        return tuple(t.grad if t.requires_grad else None for t in inputs)


def checkpoint(fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
    """``fn(*inputs)``, keeping no intermediates; they are recomputed in backward."""
    if is_grad_enabled() and not any(isinstance(t, Tensor) and t.requires_grad for t in inputs):
        # the trap of this design: parameters inside fn would silently get no gradient
        warnings.warn("checkpoint: no input requires grad, so the block is not part of "
                      "the graph and parameters used inside it get no gradient",
                      stacklevel=2)
    return _Checkpoint.apply(*inputs, fn=fn)
