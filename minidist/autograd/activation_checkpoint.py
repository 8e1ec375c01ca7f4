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

``checkpoint(block, x, policy=SavePolicy())`` checkpoints selectively: the
results of the ops the policy names (matmuls and attention by default) are kept
from the forward and handed back in the recompute (selective_checkpoint.py).

``block`` may return a tuple of tensors, as in PyTorch: a value computed inside
that the loss needs besides the block's output (a router's balancing terms,
nn/moe.py) must leave as one of them, for only what the checkpoint returns is
part of the graph; read off the block afterwards it is a constant of the
no-grad forward, and its gradient would be silently lost.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Callable

from minidist import backend
from minidist.autograd.engine import backward as run_backward
from minidist.autograd.function import Function
from minidist.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from minidist.autograd.recompute import capture_forward_context
from minidist.autograd.selective_checkpoint import SavePolicy, kept_arrays, selective
from minidist.autograd.tensor import Tensor


class _Checkpoint(Function):
    @staticmethod
    def forward(ctx, *arrays, fn=None, policy=None):
        ctx.fn_to_run, ctx.policy, ctx.n_inputs = fn, policy, len(arrays)
        ctx.rng_state = backend.default_generator().get_state()
        ctx.context = capture_forward_context()   # the autocast / FP8 policy now active
        with no_grad(), _kept_by(policy) as kept:
            out = fn(*[Tensor(a) for a in arrays])
        ctx.kept = kept
        # the inputs, then what the policy kept (saved_bytes counts them all)
        ctx.save_for_backward(*arrays, *kept_arrays(kept))
        return tuple(o.data for o in out) if isinstance(out, tuple) else out.data

    @staticmethod
    def backward(ctx, *grads):
        arrays = ctx.saved[:ctx.n_inputs]
        gen = backend.default_generator()
        state_now = gen.get_state()
        gen.set_state(ctx.rng_state)  # replay the forward's random draws
        inputs = [Tensor(a, requires_grad=need) for a, need in zip(arrays, ctx.needs_input_grad)]
        with ctx.context, enable_grad(), _kept_by(ctx.policy, ctx.kept):
            out = ctx.fn_to_run(*inputs)
            outs = out if isinstance(out, tuple) else (out,)
            roots = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            if len(roots) > 1:   # several outputs: one backward from a root that joins them
                roots = [(_Join.apply(*[o for o, _ in roots], grads=[g for _, g in roots]), None)]
        gen.set_state(state_now)
        if roots:
            run_backward(*roots[0])
        return tuple(t.grad if t.requires_grad else None for t in inputs)


class _Join(Function):
    """A scalar standing for several outputs, so that one backward reaches them
    all: its backward hands each output the gradient given for it (nothing is
    computed, so the gradients are the bits a backward from each would start with)."""

    @staticmethod
    def forward(ctx, *arrays, grads=None):
        ctx.grads = tuple(grads)
        return backend.xp.zeros(())

    @staticmethod
    def backward(ctx, grad):
        return ctx.grads


def _kept_by(policy: SavePolicy | None, kept: list | None = None):
    """The selective checkpoint of ``policy`` (recording, or replaying ``kept``), or
    nothing to do for a full checkpoint."""
    return nullcontext([]) if policy is None else selective(policy, kept)


def checkpoint(fn: Callable[..., Tensor | tuple[Tensor, ...]], *inputs: Tensor,
               policy: SavePolicy | None = None) -> Tensor | tuple[Tensor, ...]:
    """``fn(*inputs)`` (a tensor, or a tuple of tensors), keeping no intermediates;
    they are recomputed in backward. With a ``policy`` (selective_checkpoint.py)
    the results of the ops it names are kept and only the others recomputed."""
    if policy is not None:
        policy.check(op_names())
    if is_grad_enabled() and not any(isinstance(t, Tensor) and t.requires_grad for t in inputs):
        # the trap of this design: parameters inside fn would silently get no gradient
        warnings.warn("checkpoint: no input requires grad, so the block is not part of "
                      "the graph and parameters used inside it get no gradient",
                      stacklevel=2)
    return _Checkpoint.apply(*inputs, fn=fn, policy=policy)


def op_names() -> set[str]:
    """The names of every op (Function subclass) defined so far."""
    names, todo = set(), list(Function.__subclasses__())
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names
