"""The B/W split: input gradients now, weight gradients later, the same bits.

Random graphs (hypothesis) of the ops that hold weights (Linear, MatMul with a
parameter, Embedding, LayerNorm's affine, elementwise * and + with a
parameter), with weights shared between ops and branches that meet again, run
backward twice over two micro-batches: once fused (``backward``), once split
(``backward_split`` then ``WeightGradients.run``). Every gradient must be
bitwise equal, the input's after B alone, the weights' only after W.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import Tensor, backend
from minidist.autograd import backward_split
from minidist.nn import functional as F

from .strategies import FAST

WIDTH, ROWS, VOCAB = 4, 3, 6
OPS = ("linear", "linear_nobias", "matmul", "layer_norm", "mul", "add", "tanh", "residual")


@st.composite
def graphs(draw):
    """A program: a list of (op, which weight) steps; weights are drawn from a small
    pool, so the same weight can serve several ops (its gradient is a sum)."""
    n = draw(st.integers(1, 7))
    steps = [(draw(st.sampled_from(OPS)), draw(st.integers(0, 2))) for _ in range(n)]
    return dict(steps=steps, embed=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def _weights(seed):
    rng = np.random.default_rng(seed)
    shapes = {"W": (WIDTH, WIDTH), "b": (WIDTH,), "g": (WIDTH,), "E": (VOCAB, WIDTH)}
    return {f"{k}{i}": Tensor(rng.standard_normal(s), requires_grad=True)
            for k, s in shapes.items() for i in range(3)}


def _forward(graph, w, micro):
    rng = np.random.default_rng(graph["seed"] + 1000 * micro)
    if graph["embed"]:          # the first piece of a model: ids -> rows, no input gradient
        x = None
        ids = backend.from_host(rng.integers(0, VOCAB, (ROWS,)))
        h = F.embedding(ids, w["E0"]) + F.embedding(ids, w["E1"])
    else:                       # a later piece: its input x wants a gradient (B's output)
        x = Tensor(rng.standard_normal((ROWS, WIDTH)), requires_grad=True)
        h = x
    seen = [h]
    for op, k in graph["steps"]:
        W, b, g = w[f"W{k}"], w[f"b{k}"], w[f"g{k}"]
        if op == "linear":
            h = F.linear(h, W, b)
        elif op == "linear_nobias":
            h = F.linear(h, W)
        elif op == "matmul":
            h = h @ W
        elif op == "layer_norm":
            h = F.layer_norm(h, g, b)
        elif op == "mul":
            h = h * g
        elif op == "add":
            h = h + b
        elif op == "tanh":
            h = h.tanh()
        else:                   # two branches meet: a gradient reaches seen[k] twice
            h = h + seen[k % len(seen)]
        seen.append(h)
    target = Tensor(rng.standard_normal((ROWS, WIDTH)))
    return x, (h * target).sum()


def _host(a):
    return None if a is None else np.array(backend.to_host(a))


@FAST
@given(graph=graphs())
def test_b_then_w_equals_the_fused_backward_bit_for_bit(graph):
    fused, split = _weights(graph["seed"]), _weights(graph["seed"])
    for micro in range(2):      # the second adds into .grad, as micro-batches do
        x1, loss1 = _forward(graph, fused, micro)
        loss1.backward()
        x2, loss2 = _forward(graph, split, micro)
        before = {k: _host(t.grad) for k, t in split.items()}
        w_pass = backward_split(loss2, weights=split.values())
        if x2 is not None:      # B gave the input its gradient already
            assert np.array_equal(_host(x1.grad), _host(x2.grad))
        for k, t in split.items():      # ... and left every weight untouched
            after_b = _host(t.grad)
            assert (before[k] is None and after_b is None) or np.array_equal(before[k], after_b)
        w_pass.run()
        for k in fused:
            a, b = _host(fused[k].grad), _host(split[k].grad)
            assert (a is None) == (b is None), k
            if a is not None:
                assert np.array_equal(a, b), (k, np.abs(a - b).max())


def test_each_closure_reports_the_bytes_it_keeps_alive():
    # y = x W^T: W's closure keeps x (3 x 4 float64) and dL/dy (3 x 4): 192 bytes;
    # W itself lives anyway and is not counted
    w = Tensor(np.ones((WIDTH, WIDTH)), requires_grad=True)
    x = Tensor(np.ones((ROWS, WIDTH)), requires_grad=True)
    y = F.linear(x, w)
    w_pass = backward_split(y, grad=backend.from_host(np.ones((ROWS, WIDTH))), weights=[w])
    assert w_pass.closures() == [("Linear", 2 * ROWS * WIDTH * 8)]
    assert w_pass.held_bytes == 2 * ROWS * WIDTH * 8
    assert w.grad is None and x.grad is not None
    w_pass.run()
    assert np.array_equal(_host(w.grad), np.full((WIDTH, WIDTH), float(ROWS)))
    with pytest.raises(RuntimeError, match="already computed"):
        w_pass.run()


def test_a_weight_must_be_a_leaf():
    w = Tensor(np.ones((2, 2)), requires_grad=True)
    with pytest.raises(ValueError, match="leaf"):
        backward_split((w * 2).sum(), weights=[w * 2])


def test_post_accumulate_hooks_fire_in_w_once():
    w = Tensor(np.ones((WIDTH, WIDTH)), requires_grad=True)
    x = Tensor(np.ones((ROWS, WIDTH)), requires_grad=True)
    fired = []
    w.register_post_accumulate_grad_hook(lambda t: fired.append(t.grad.copy()))
    loss = (F.linear(x, w) @ w).sum()           # w used twice: one hook, after both
    w_pass = backward_split(loss, weights=[w])
    assert fired == []
    w_pass.run()
    assert len(fired) == 1 and np.array_equal(_host(fired[0]), _host(w.grad))
