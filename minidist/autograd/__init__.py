"""A small reverse-mode autograd on arrays of the active backend.

- ``Tensor``: data + grad + the op that made it (tensor.py)
- ``Function``: forward and backward of one op; custom ops subclass it (function.py)
- the backward pass (engine.py): topological order, each op's backward, gradient
  sums, leaves (into an existing ``.grad`` in place; copied into one given by
  ``set_empty_grad``); ``no_grad`` (grad_mode.py)
- where code outside joins a backward: a node's hooks (``Context.register_prehook``,
  ``register_hook``) and an identity whose backward calls a hook (hooks.py, ``on_gradient``)
- the backward split into input (B) and deferred weight (W) gradients
  (weight_grad.py), through the engine's one extension point, ``split``
- every op (ops/), ``gradcheck`` (gradcheck.py), ``checkpoint`` (activation_checkpoint.py),
  selectively with a ``SavePolicy`` (selective_checkpoint.py: matmuls and attention kept)
- what a recompute re-enters (the precision policy, registered from above):
  ``register_recompute_context`` / ``capture_forward_context`` (recompute.py)
"""
from minidist.autograd.activation_checkpoint import checkpoint
from minidist.autograd.engine import set_empty_grad
from minidist.autograd.function import Context, Function
from minidist.autograd.functional import concat, matmul, split, stack, where
from minidist.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from minidist.autograd.gradcheck import GradcheckError, gradcheck
from minidist.autograd.recompute import capture_forward_context, register_recompute_context
from minidist.autograd.selective_checkpoint import SavePolicy
from minidist.autograd.tensor import Tensor, tensor
from minidist.autograd.weight_grad import WeightGradients, backward_split

__all__ = ["Tensor", "tensor", "Function", "Context", "no_grad", "enable_grad",
           "is_grad_enabled", "set_grad_enabled", "gradcheck", "GradcheckError",
           "checkpoint", "SavePolicy", "concat", "stack", "split", "where", "matmul",
           "backward_split", "WeightGradients", "register_recompute_context",
           "capture_forward_context", "set_empty_grad"]
