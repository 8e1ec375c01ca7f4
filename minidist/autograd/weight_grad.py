"""The backward split in two: B (input gradients) now, W (weight gradients) later.

For a layer y = x W^T the backward is two independent products
(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2):

    B:  dL/dx = dL/dy @ W        what the previous pipeline stage waits for
    W:  dL/dW = dL/dy^T @ x      what only this stage's optimizer step needs

``backward_split(loss, weights=params)`` walks the graph as ``backward`` does,
but every op that has a weight among its inputs computes only the gradients
of its other inputs; its weight part is kept as a deferred closure (the op's
node with what it saved, and the gradient of its output). The returned
``WeightGradients`` runs them all later, in the order the fused backward would
have, and adds each weight's contributions in that same order: the gradients
are equal bit for bit to ``loss.backward()``'s.

What it costs: until W runs, each closure keeps the op's saved activations and
its output gradient alive (``held_bytes``); a pipeline stage holds a
micro-batch's activations from its F to its W instead of to its B.

Ops opt in with ``Function.splits_weight_grad`` (Linear, MatMul, Embedding,
LayerNorm, + - * /). Another op with a weight input (one that communicates in
its backward, say) runs whole in B, and only its finished weight gradients wait.
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from minidist.autograd import grad_mode
from minidist.autograd.engine import (LeafGradients, call_backward, deliver, initial_grad,
                                      release, run_graph)
from minidist.autograd.function import Context
from minidist.backend import is_array


_in_b_pass = False   # True while backward_split's B pass runs (read through in_b_pass)


def in_b_pass() -> bool:
    """Whether a split backward's B pass is running: the ops running now leave their
    weights' gradients to a later W pass. (A trace of modules asks: a module's
    parameters then get their gradients after its backward, not at its end.)"""
    return _in_b_pass


class Deferred(NamedTuple):
    """The W part of one op, left by B."""
    node: Context            # the op, its saved values kept until W
    grads_out: Any           # its output gradients (None when ``done``)
    weights: tuple           # its weight inputs (None at the other inputs)
    done: tuple | None       # an op that cannot split ran whole: its weights' gradients


class DeferWeights:
    """B: what the engine (``run_graph(..., split=)``) calls at each node of a split
    backward. A node with a weight among its inputs computes its other inputs'
    gradients now and leaves a ``Deferred``; the engine keeps the node's saved
    values while W needs them."""

    def __init__(self, weights: set[int]):
        self.weights = weights          # ids of the weight leaves
        self.records: list[Deferred] = []

    def backward(self, node: Context, grads_out: Any) -> tuple:
        """The node's input gradients now, None for its weights."""
        later = tuple(t is not None and id(t) in self.weights for t in node.inputs)
        if not any(later):
            return call_backward(node, grads_out)
        weights = tuple(t if w else None for t, w in zip(node.inputs, later))
        if node.fn.splits_weight_grad:   # the input gradients now, the weights' later
            grads_in = call_backward(node, grads_out, asked=tuple(not w for w in later))
            self.records.append(Deferred(node, grads_out, weights, None))
            return grads_in
        # One backward for all (it may communicate): keep the weights' part.
        grads_in = call_backward(node, grads_out)
        self.records.append(Deferred(node, None, weights,
                                     tuple(g if w else None for g, w in zip(grads_in, later))))
        return tuple(None if w else g for g, w in zip(grads_in, later))

    def keeps(self, node: Context) -> bool:
        """Whether W still needs what ``node`` saved."""
        return bool(self.records) and self.records[-1].node is node \
            and self.records[-1].done is None


class WeightGradients:
    """The W pass of one split backward: call ``run()`` once to fill ``.grad``."""

    def __init__(self, records: list[Deferred], weights: dict[int, Any], retain_graph: bool):
        self._records = records
        self._weight_data = {id(w.data) for w in weights.values()}
        self._retain = retain_graph
        self.done = False

    def __len__(self) -> int:
        """How many ops left a weight-gradient closure."""
        return len(self._records)

    def closures(self) -> list[tuple[str, int]]:
        """(op name, bytes its closure keeps alive) for each deferred op, in order."""
        return [(record.node.fn.__name__, self._bytes([record])) for record in self._records]

    @property
    def held_bytes(self) -> int:
        """Bytes of arrays kept alive only for W: saved activations and output
        gradients, each array counted once; the weights themselves not (they
        live anyway)."""
        return self._bytes(self._records)

    def _bytes(self, records: list) -> int:
        seen: dict[int, int] = {}
        for node, grads_out, _, done in records:
            held = list(done or ()) + list(grads_out or ())
            if done is None:
                held += list(getattr(node, "saved", ()))
                held += [v for k, v in vars(node).items() if k != "saved" and is_array(v)]
            for a in held:
                if is_array(a) and id(a) not in self._weight_data:
                    seen[id(a)] = a.nbytes
        return sum(seen.values())

    def run(self) -> None:
        """Compute every deferred weight gradient and add it into ``weight.grad``."""
        if self.done:
            raise RuntimeError("these weight gradients were already computed: "
                               "each split backward has one W pass")
        self.done = True
        leaves = LeafGradients()          # summed in the fused backward's order
        for record in self._records:
            for t in record.weights:
                if t is not None:
                    leaves.expect(t)
        with grad_mode.no_grad():
            for node, grads_out, weights, done in self._records:
                if done is None:
                    grads = call_backward(node, grads_out, asked=tuple(t is not None
                                                                      for t in weights))
                else:
                    grads = done
                for t, g in zip(weights, grads):
                    if t is not None:
                        leaves.add(t, g)
                if done is None and not self._retain:
                    release(node)
        self._records = []


def backward_split(root: Any, grad: Any = None, weights: Iterable = (),
                   retain_graph: bool = False) -> WeightGradients:
    """B now, W later: input gradients into every other leaf's ``.grad`` at once;
    ``weights``' gradients when the returned ``WeightGradients.run()`` is called.

    ``weights``: leaf tensors (a module's ``parameters()``). Other leaves (a
    pipeline stage's input x) get their gradient now, as from ``backward``."""
    global _in_b_pass
    by_id = {id(w): w for w in weights}
    for w in by_id.values():
        if w._ctx is not None:
            raise ValueError("backward_split: weights must be leaf tensors (parameters), "
                             "not results of an op")
    grad = initial_grad(root, grad)
    split = DeferWeights(set(by_id))
    if root._ctx is None:               # a leaf: d(leaf)/d(leaf) = 1, nothing to split
        deliver(root, grad)
    else:
        _in_b_pass = True
        try:
            with grad_mode.no_grad():
                run_graph(root, grad, retain_graph, split)
        finally:
            _in_b_pass = False
    return WeightGradients(split.records, by_id, retain_graph)
