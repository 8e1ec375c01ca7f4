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
       with earlier layers. A leaf that already holds a ``.grad`` array gets
       the gradient added into that array in place, as in PyTorch: DDP sets
       it to a view of its bucket, so the gradient lands where the all-reduce
       reads it, in one pass (parallel/data/ddp.py). A ``.grad`` given with
       ``set_empty_grad`` (memory whose values are not written yet, as
       ``torch.empty``) gets its first gradient copied in, later ones added.

Unless ``retain_graph=True``, each node drops what it saved as soon as it has
run, so memory falls as backward proceeds; a second backward through the same
graph is then an error, as in PyTorch.

Three extension points: ``run_graph(..., split=)`` hands each node's backward to a
``split`` object, which may compute part of it now and keep the rest, and
keeps those nodes' saved values alive: the B/W split of zero-bubble
pipelines (weight_grad.py). A node's hooks (``Context.register_prehook`` /
``register_hook``, and the identity of hooks.py) run around its backward: a
trace's module spans (nn/module_trace.py). And ``queue_callback(fn)`` (torch's
``Variable._execution_engine.queue_callback``) runs ``fn`` once the outermost
backward now running has visited its last node: fully_shard waits there for the
gradients' reduce-scatters it left in flight (distributed/fsdp/post_backward.py).
A backward that raises calls their ``on_error`` instead.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from minidist.autograd import grad_mode
from minidist.backend import xp

if TYPE_CHECKING:  # function.py makes Tensors, whose backward is this module's
    from minidist.autograd.function import Context


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


# id(leaf) -> the array set_empty_grad gave it as .grad, until a gradient is written there
_empty_grads: dict[int, Any] = {}


def set_empty_grad(leaf: Any, array: Any) -> None:
    """Make ``array`` the ``.grad`` of ``leaf`` without writing it: its values
    count for nothing (as ``torch.empty``'s), so the next backward copies the
    leaf's gradient into it, where a written ``.grad`` gets it added. The same
    bits as filling it with -0.0 first (-0.0 + g is g), without the pass over
    the memory: DDP gives each parameter its bucket view so (parallel/data/ddp.py).
    Until that backward, ``leaf.grad`` shows whatever the memory held."""
    leaf.grad = array
    _empty_grads[id(leaf)] = array


def deliver(leaf: Any, grad: Any) -> None:
    """Add a finished gradient into ``leaf.grad`` and fire the leaf's hooks."""
    if grad.dtype != leaf.data.dtype:
        grad = grad.astype(leaf.data.dtype)
    if leaf.grad is None:
        leaf.grad = grad.copy()  # a copy: the array may be another tensor's gradient too
    else:
        if tuple(leaf.grad.shape) != tuple(grad.shape):
            raise RuntimeError(f"a leaf's .grad has shape {tuple(leaf.grad.shape)} but its "
                               f"gradient has shape {tuple(grad.shape)}: set .grad to None or "
                               f"to an array of the leaf's shape")
        if _empty_grads.pop(id(leaf), None) is leaf.grad:
            # The first gradient into an empty .grad: a copy. +g is g bit for bit;
            # the ufunc's loop copies MB-sized arrays faster than memcpy here
            # (2.7 vs 3.2 ms for 8 x 4 MiB, 1 thread, 2-core VM).
            xp.positive(grad, out=leaf.grad)
        else:
            xp.add(leaf.grad, grad, out=leaf.grad)  # in place: .grad stays the same array
    for hook in leaf._hooks:
        hook(leaf)


def backward(root: Any, grad: Any = None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) * grad into every leaf's ``.grad``."""
    grad = initial_grad(root, grad)
    if root._ctx is None:  # backward on a leaf: d(leaf)/d(leaf) = 1
        deliver(root, grad)
        return

    with grad_mode.no_grad():
        run_graph(root, grad, retain_graph)


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


class LeafGradients:
    """Step 3 of the module docstring: the gradients meeting at each leaf, summed in
    the order they arrive, delivered into ``leaf.grad`` (its hooks fired) once every
    use of the leaf has been visited. The engine's backward and the B/W split's W pass
    (weight_grad.py) both accumulate through one of these."""

    def __init__(self) -> None:
        self.pending: dict[int, int] = {}    # id(leaf) -> uses not yet visited
        self.sums: dict[int, Any] = {}       # id(leaf) -> the sum of its gradients so far

    def expect(self, leaf: Any) -> None:
        """One more use of ``leaf`` to visit before its gradient is complete."""
        self.pending[id(leaf)] = self.pending.get(id(leaf), 0) + 1

    def add(self, leaf: Any, grad: Any) -> None:
        """One use of ``leaf`` visited, with its gradient (None: it gave none)."""
        key = id(leaf)
        if grad is not None:
            prev = self.sums.get(key)
            self.sums[key] = grad if prev is None else prev + grad
        self.pending[key] -= 1
        if self.pending[key] == 0 and key in self.sums:
            deliver(leaf, self.sums.pop(key))


class _Running(threading.local):
    """This thread's backwards now running (a node's backward may run one inside it: a
    recompute), and what to call when the outermost one ends (queue_callback). Per
    thread: DualPipeV's F&B op runs a backward on a second thread (comm/collectives/
    interleave.py), beside the main thread's."""

    def __init__(self) -> None:
        self.depth = 0
        self.callbacks: list[tuple[Callable[[], None], Callable[[], None] | None]] = []


_running = _Running()


def queue_callback(fn: Callable[[], None], on_error: Callable[[], None] | None = None) -> None:
    """Run ``fn()`` when the outermost backward now running on this thread has visited
    its last node (at once if none is running), after the callbacks queued before it;
    if that backward raises, ``on_error()`` instead (when given)."""
    if _running.depth == 0:
        fn()
        return
    _running.callbacks.append((fn, on_error))


def run_graph(root: Any, grad: Any, retain_graph: bool, split: Any = None) -> None:
    """The backward pass (steps 1-3 of the module docstring), then, for the outermost
    one, the callbacks queued while it ran. ``split``: None, or the B/W split's
    ``DeferWeights`` (weight_grad.py): ``split.backward(node, grads_out)`` stands in
    for the node's backward, and nodes it ``keeps`` are not released."""
    _running.depth += 1
    try:
        _visit_graph(root, grad, retain_graph, split)
    except BaseException:
        if _running.depth == 1:
            callbacks, _running.callbacks = _running.callbacks, []
            for _, on_error in callbacks:
                if on_error is not None:
                    on_error()
        raise
    finally:
        _running.depth -= 1
    if _running.depth == 0:
        while _running.callbacks:             # (a callback may queue another)
            fn, _ = _running.callbacks.pop(0)
            fn()


def _visit_graph(root: Any, grad: Any, retain_graph: bool, split: Any) -> None:
    order = _topological_order(root._ctx)
    leaves = LeafGradients()
    for node in order:
        for t in node.inputs:
            if t is not None and t._ctx is None:
                leaves.expect(t)
    out_grads: dict[int, list] = {id(root._ctx): [None] * root._ctx.n_outputs}
    out_grads[id(root._ctx)][root._out_index] = grad
    for node in reversed(order):
        grads_in = _node_backward(node, out_grads.pop(id(node), None), split)
        for t, g in zip(node.inputs, grads_in):
            if t is None:
                continue
            if g is not None and tuple(g.shape) != tuple(t.shape):
                raise RuntimeError(f"{node.fn.__name__}.backward returned a gradient "
                                   f"of shape {tuple(g.shape)} for an input of shape "
                                   f"{tuple(t.shape)}")
            if t._ctx is None:  # a leaf
                leaves.add(t, g)
            elif g is not None:
                slots = out_grads.setdefault(id(t._ctx), [None] * t._ctx.n_outputs)
                prev = slots[t._out_index]
                slots[t._out_index] = g if prev is None else prev + g
        if not retain_graph and (split is None or not split.keeps(node)):
            release(node)


def _node_backward(node: Context, grads_out: list | None, split: Any) -> tuple:
    """The gradients of ``node``'s inputs from those of its outputs (None where
    nothing flows through it; zeros for outputs no one used)."""
    if getattr(node, "released", False):
        raise RuntimeError(
            f"backward through {node.fn.__name__} a second time: its saved "
            "values were freed after the first backward. Pass "
            "retain_graph=True to the first backward if you need two.")
    if grads_out is None:  # nothing flows through this node
        return (None,) * len(node.inputs)
    if node.n_outputs > 1:  # outputs no one used get zero gradient
        grads_out = [g if g is not None else xp.zeros(shape, dtype)
                     for g, (shape, dtype) in zip(grads_out, node.out_meta)]
    if split is None:
        return call_backward(node, grads_out)
    return split.backward(node, grads_out)


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
        for hook in node.pre_hooks:     # (Context.register_prehook: a trace times the op)
            hook(node)
        grads_in = node.fn.backward(node, *grads_out)
        for hook in node.post_hooks:
            hook(node)
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


def release(node: Context) -> None:
    """Free what the node saved; keep only what an error message needs."""
    fn, n_outputs = node.fn, node.n_outputs
    node.__dict__.clear()
    node.fn = fn
    node.n_outputs = n_outputs  # read before the loop reaches the error
    node.inputs = ()
    node.released = True
