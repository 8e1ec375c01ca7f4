"""``Function``: an operation with a forward and a backward, the unit of autograd.

Every op in minidist is a ``Function`` subclass whose two static methods sit
side by side::

    class Mul(Function):
        @staticmethod
        def forward(ctx, a, b):          # arrays in, array out
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, grad):         # dL/d(out) in, dL/d(inputs) out
            a, b = ctx.saved
            return grad * b, grad * a    # local derivative x upstream gradient

``Mul.apply(x, y)`` unwraps the ``Tensor`` arguments into arrays, runs
``forward``, and, when a gradient is wanted, records a ``Context`` node that
links the output to its inputs. Code outside the autograd package (collectives,
flash attention) writes its own ops the same way.

Rules for a backward:
- return one gradient per positional argument of forward (``None`` for
  arguments that are not tensors or need no gradient), each of the input's shape;
- never modify ``grad`` in place: the same array may be handed to several ops.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd import grad_mode, selective_checkpoint


class Context:
    """What a forward leaves for its backward, plus the graph edges.

    ``ctx.saved`` holds what ``save_for_backward`` stored; forward may also set
    any attribute (``ctx.axis = axis``). ``ctx.needs_input_grad[i]`` tells
    whether argument ``i`` is a tensor that wants a gradient.

    Code outside the autograd joins a node's backward through its hooks (torch's
    ``grad_fn.register_prehook`` / ``register_hook``): ``hook(node)`` runs just
    before / just after each call of the op's ``backward`` (twice under a B/W split).
    """

    pre_hooks: tuple = ()     # hook(node) before the op's backward (register_prehook)
    post_hooks: tuple = ()    # hook(node) after it (register_hook)

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def register_prehook(self, hook: Any) -> None:
        """Call ``hook(self)`` just before each call of this node's backward."""
        self.pre_hooks = self.pre_hooks + (hook,)

    def register_hook(self, hook: Any) -> None:
        """Call ``hook(self)`` just after each call of this node's backward."""
        self.post_hooks = self.post_hooks + (hook,)


class Function:
    """Base class of every differentiable operation (see the module docstring)."""

    # True where backward computes each input's gradient only if
    # needs_input_grad asks for it, and has no side effect (no communication):
    # the engine may then call it twice, for the input gradients first and the
    # weight gradients later (the B/W split, weight_grad.py).
    splits_weight_grad = False

    @staticmethod
    def forward(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Context, *grads: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any):
        from minidist.autograd.tensor import Tensor

        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        # a selective checkpoint's recompute hands back what its forward kept
        kept = selective_checkpoint.replay(cls.__name__)
        if kept is not None:
            ctx, out = kept
            ctx.needs_input_grad = needs
        else:
            ctx = Context()
            ctx.needs_input_grad = needs
            arrays = tuple(a.data if isinstance(a, Tensor) else a for a in args)
            out = cls.forward(ctx, *arrays, **kwargs)
            selective_checkpoint.record(cls.__name__, ctx, out)

        track = any(needs) and grad_mode.is_grad_enabled()
        if not track:
            if isinstance(out, tuple):
                return tuple(Tensor(o) for o in out)
            return Tensor(out)

        ctx.fn = cls
        ctx.inputs = tuple(a if n else None for a, n in zip(args, needs))
        if isinstance(out, tuple):
            ctx.n_outputs = len(out)
            # shapes and dtypes, to stand in zeros for outputs no one used
            ctx.out_meta = tuple((o.shape, o.dtype) for o in out)
            return tuple(Tensor._from_op(o, ctx, i) for i, o in enumerate(out))
        ctx.n_outputs = 1
        return Tensor._from_op(out, ctx, 0)
