"""The backward pass: walk the graph from the loss back to the leaves.

    1. Sort the op nodes (``Context``) so each comes after the ops that made
       its inputs (a topological order), by depth-first search from the root.
    2. Visit them in reverse. Each node's ``backward`` turns the gradient of its
       output(s) into gradients of its inputs (the chain rule:
       dL/dx = dL/dy * dy/dx). Gradients meeting at a tensor are summed.
    3. A leaf (a tensor made by the user, e.g. a parameter) is *ready* once every
       op that used it has been visited. Then its gradient is added into
       ``leaf.grad`` and its post-accumulate hooks fire. Data-parallel code uses
       those hooks to start communicating a gradient while backward continues
       with earlier layers. A leaf's first gradient is copied into
       ``leaf.grad_home`` when it has one (DDP's view of its bucket), so that
       it lands where the all-reduce reads it, in one copy.

Unless ``retain_graph=True``, each node drops what it saved as soon as it has
run, so memory falls as backward proceeds; a second backward through the same
graph is then an error, as in PyTorch.

``_run`` can also leave the gradients of some leaves (the weights) for later:
the B/W split of zero-bubble pipelines, built on it in weight_grad.py.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd import grad_mode
from minidist.autograd.function import Context
from minidist.backend import xp


def _topological_order(root: Context) -> list[Context]:
    """Op nodes reachable from ``root``, each after the nodes that feed it."""
    order: list[Context] = []
    visited: set[int] = set()
    stack: list[tuple[Context, bool]] = [(root, False)]
    while stack:  # iterative DFS: deep graphs must not hit the recursion limit
        node, children_done = stack.pop()
        if children_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            if t is not None and t._ctx is not None and id(t._ctx) not in visited:
                stack.append((t._ctx, False))
    return order


def _deliver(leaf: Any, grad: Any) -> None:
    """Add a finished gradient into ``leaf.grad`` and fire the leaf's hooks."""
    if grad.dtype != leaf.data.dtype:
        grad = grad.astype(leaf.data.dtype)
    if leaf.grad is None:
        # copy: the array may be shared with other tensors' gradients. Into the
        # leaf's grad_home when it has one (DDP's bucket view: one copy, where
        # the all-reduce wants it), else into a new array.
        home = leaf.grad_home
        if home is not None and home.shape == grad.shape and home.dtype == grad.dtype:
            home[...] = grad
            leaf.grad = home
        else:
            leaf.grad = grad.copy()
    else:
        leaf.grad += grad
    for hook in leaf._hooks:
        hook(leaf)


def backward(root: Any, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) * grad into every leaf's ``.grad``."""
    grad = initial_grad(root, grad)
    if root._ctx is None:  # backward on a leaf: d(leaf)/d(leaf) = 1
        _deliver(root, grad)
        return

    with grad_mode.no_grad():
        _run(root, grad, retain_graph)


def initial_grad(root: Any, grad: Any) -> Any:
    """The gradient backward starts from, checked: ones for a scalar, else ``grad``."""
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad "
                           "(was it made under no_grad, or from leaves with "
                           "requires_grad=False?)")
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(f"backward() without a gradient needs a scalar output; "
                               f"this one has shape {root.shape}: pass grad=")
        grad = xp.ones_like(root.data)
    elif isinstance(grad, type(root)):  # a Tensor, as torch's backward(gradient)
        grad = grad.data
    if tuple(grad.shape) != tuple(root.shape):
        raise ValueError(f"grad has shape {tuple(grad.shape)} but the output has "
                         f"shape {tuple(root.shape)}")
    if grad.dtype != root.dtype:  # as torch: the gradient takes the output's dtype
        grad = grad.astype(root.dtype)
    return grad


def _run(root: Any, grad: Any, retain_graph: bool, weights: set[int] | None = None) -> list:
    """The backward pass. With ``weights`` (ids of leaves), gradients for those
    leaves wait: each node that has one as input is returned, in visiting order,
    as (node, its output gradients, its weight inputs (None elsewhere), None),
    unreleased, for weight_grad.py to finish later; a node whose op cannot
    split (``Function.splits_weight_grad`` False) has run whole and comes as
    (node, None, its weight inputs, their gradients). Returns [] without."""
    order = _topological_order(root._ctx)
    deferred: list = []

    # how many uses of each leaf remain to be visited
    pending: dict[int, int] = {}
    for node in order:
        for t in node.inputs:
            if t is not None and t._ctx is None:
                pending[id(t)] = pending.get(id(t), 0) + 1

    out_grads: dict[int, list] = {id(root._ctx): [None] * root._ctx.n_outputs}
    out_grads[id(root._ctx)][root._out_index] = grad
    leaf_grads: dict[int, Any] = {}

    for node in reversed(order):
        if getattr(node, "released", False):
            raise RuntimeError(
                f"backward through {node.fn.__name__} a second time: its saved "
                "values were freed after the first backward. Pass "
                "retain_graph=True to the first backward if you need two.")
        grads_out = out_grads.pop(id(node), None)
        if grads_out is None:  # nothing flows through this node
            grads_in: tuple = (None,) * len(node.inputs)
        else:
            if node.n_outputs > 1:  # outputs no one used get zero gradient
                grads_out = [g if g is not None else xp.zeros(shape, dtype)
                             for g, (shape, dtype) in zip(grads_out, node.out_meta)]
            later = _weight_inputs(node, weights)
            if later is None:
                grads_in = call_backward(node, grads_out)
            elif node.fn.splits_weight_grad:    # the input gradients now, the weights' later
                now = tuple(not w for w in later)
                grads_in = call_backward(node, grads_out, asked=now)
                deferred.append((node, grads_out, _pick(node.inputs, later), None))
            else:   # one backward for all (it may communicate): keep the weights' part
                grads_in = call_backward(node, grads_out)
                deferred.append((node, None, _pick(node.inputs, later),
                                 _pick(grads_in, later)))

        for t, g in zip(node.inputs, grads_in):
            if t is None or (weights is not None and id(t) in weights):
                continue
            if g is not None and tuple(g.shape) != tuple(t.shape):
                raise RuntimeError(f"{node.fn.__name__}.backward returned a gradient "
                                   f"of shape {tuple(g.shape)} for an input of shape "
                                   f"{tuple(t.shape)}")
            if t._ctx is None:  # a leaf
                if g is not None:
                    prev = leaf_grads.get(id(t))
                    leaf_grads[id(t)] = g if prev is None else prev + g
                pending[id(t)] -= 1
                if pending[id(t)] == 0 and id(t) in leaf_grads:
                    _deliver(t, leaf_grads.pop(id(t)))
            elif g is not None:
                slots = out_grads.setdefault(id(t._ctx), [None] * t._ctx.n_outputs)
                prev = slots[t._out_index]
                slots[t._out_index] = g if prev is None else prev + g

        if not retain_graph and not (deferred and deferred[-1][0] is node
                                     and deferred[-1][3] is None):
            _release(node)
    return deferred


def _weight_inputs(node: Context, weights: set[int] | None) -> tuple | None:
    """Which of the node's inputs are weights whose gradient waits, or None."""
    if weights is None:
        return None
    mask = tuple(t is not None and id(t) in weights for t in node.inputs)
    return mask if any(mask) else None


def _pick(values: tuple, mask: tuple) -> tuple:
    return tuple(x if w else None for x, w in zip(values, mask))


def call_backward(node: Context, grads_out: Any, asked: tuple | None = None) -> tuple:
    """``node.fn.backward``: one gradient per input, checked.

    ``asked`` (a flag per input) narrows ``needs_input_grad`` for an op that
    splits its backward (``Function.splits_weight_grad``) and drops any other
    gradient (None): each gradient is computed the one way it always is, only
    at a different time, so the split changes no bit."""
    needs = node.needs_input_grad
    if asked is not None and node.fn.splits_weight_grad:
        narrowed = tuple(n and a for n, a in zip(needs, asked))
        if not any(narrowed):           # e.g. an embedding's B: nothing to do now
            return (None,) * len(node.inputs)
        node.needs_input_grad = narrowed
    try:
        grads_in = node.fn.backward(node, *grads_out)
    finally:
        node.needs_input_grad = needs
    if not isinstance(grads_in, tuple):
        grads_in = (grads_in,)
    if len(grads_in) != len(node.inputs):
        raise RuntimeError(f"{node.fn.__name__}.backward returned "
                           f"{len(grads_in)} gradients for "
                           f"{len(node.inputs)} inputs")
    if asked is not None:
        grads_in = tuple(g if a else None for g, a in zip(grads_in, asked))
    return grads_in


def _release(node: Context) -> None:
    """Free what the node saved; keep only what an error message needs."""
    fn, n_outputs = node.fn, node.n_outputs
    node.__dict__.clear()
    node.fn = fn
    node.n_outputs = n_outputs  # read before the loop reaches the error
    node.inputs = ()
    node.released = True
