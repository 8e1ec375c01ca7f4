"""The backward pass: accumulation, graph lifetime, hooks, and the Function API.

These are the engine's promises that the data-parallel code builds on: a leaf's
post-accumulate hook fires once per backward, after its gradient is complete,
layer by layer from the last to the first.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minidist
from minidist import Function, Tensor, backend, no_grad
from minidist.autograd import enable_grad, is_grad_enabled, ops
from minidist.backend import xp

from .strategies import FAST, randn, seeds, shapes


def leaf(array) -> Tensor:
    return Tensor(array, requires_grad=True)


def grad_of(t: Tensor) -> np.ndarray:
    return np.array(backend.to_host(t.grad))


# --------------------------------------------------------------------------
# Accumulation
# --------------------------------------------------------------------------

@FAST
@given(shape=shapes, seed=seeds, n_calls=st.integers(1, 4))
def test_gradients_accumulate_across_backward_calls(shape, seed, n_calls):
    x = leaf(randn(seed, shape))
    for _ in range(n_calls):
        (x * 3.0).sum().backward()
    np.testing.assert_array_equal(grad_of(x), np.full(shape, 3.0 * n_calls))
    x.grad = None  # reset, as an optimizer's zero_grad(set_to_none=True)
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(grad_of(x), np.full(shape, 3.0))


@FAST
@given(shape=shapes, seed=seeds)
def test_a_tensor_used_twice_gets_the_sum_of_both_gradients(shape, seed):
    values = randn(seed, shape)
    x = leaf(values)
    (x * x).sum().backward()                  # d/dx x^2 = 2x: both uses of x
    np.testing.assert_array_equal(grad_of(x), 2 * values)

    x.grad = None
    h = x.exp()                                # an intermediate used twice
    (h + h * 2.0).sum().backward()
    np.testing.assert_allclose(grad_of(x), 3 * np.exp(values), rtol=1e-15)


def test_backward_on_a_leaf_gives_ones():
    x = leaf(np.array(2.0))
    x.backward()
    assert grad_of(x) == 1.0


def test_backward_takes_the_upstream_gradient_as_an_array_or_a_tensor():
    x = leaf(randn(0, (2, 3)))
    g = randn(1, (2, 3))
    (x * 2.0).backward(backend.from_host(g))
    np.testing.assert_array_equal(grad_of(x), 2 * g)
    x.grad = None
    (x * 2.0).backward(Tensor(g))
    np.testing.assert_array_equal(grad_of(x), 2 * g)


def test_an_upstream_gradient_of_another_dtype_takes_the_output_dtype():
    x = leaf(randn(0, (3,), "float32"))
    y = x * 2.0
    y.backward(Tensor(np.ones(3)))             # float64 upstream, float32 output
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(grad_of(x), np.full(3, 2.0, "float32"))


def test_backward_on_a_non_scalar_without_a_gradient_raises():
    x = leaf(randn(0, (2, 3)))
    with pytest.raises(RuntimeError, match="scalar output"):
        (x * 2.0).backward()
    with pytest.raises(ValueError, match="shape"):
        (x * 2.0).backward(backend.from_host(np.ones((3, 2))))
    (x * 2.0).sum(keepdims=True).backward()    # one element, any shape: fine
    np.testing.assert_array_equal(grad_of(x), np.full((2, 3), 2.0))


def test_backward_on_a_tensor_that_needs_no_grad_raises():
    x = Tensor(randn(0, (3,)))
    with pytest.raises(RuntimeError, match="does not require grad"):
        (x * 2.0).sum().backward()


# --------------------------------------------------------------------------
# Graph recording and lifetime
# --------------------------------------------------------------------------

def test_no_grad_builds_no_graph():
    x = leaf(randn(0, (3,)))
    with no_grad():
        assert not is_grad_enabled()
        y = (x * 2.0).exp().sum()
        with enable_grad():
            z = (x * 2.0).sum()
    assert is_grad_enabled()
    assert y._ctx is None and not y.requires_grad
    assert z._ctx is not None and z.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()

    @no_grad()
    def step(t):
        return t * 2.0

    assert step(x)._ctx is None and is_grad_enabled()


def test_ops_on_tensors_that_need_no_grad_build_no_graph():
    a, b = Tensor(randn(0, (3,))), Tensor(randn(1, (3,)))
    y = a * b + a
    assert y._ctx is None and not y.requires_grad


def test_backward_twice_without_retain_graph_raises_a_clear_error():
    x = leaf(randn(0, (3,)))
    loss = (x.exp() * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        loss.backward()


def test_backward_twice_with_retain_graph_gives_twice_the_gradient():
    values = randn(0, (3,))
    x = leaf(values)
    loss = (x.exp() * x).sum()
    loss.backward(retain_graph=True)
    once = grad_of(x)
    loss.backward()
    np.testing.assert_array_equal(grad_of(x), 2 * once)
    np.testing.assert_allclose(once, np.exp(values) * (values + 1), rtol=1e-15)


def test_backward_frees_saved_values_without_retain_graph():
    x = leaf(randn(0, (3,)))
    y = x.exp()
    node = y._ctx
    assert hasattr(node, "saved")
    y.sum().backward()
    assert not hasattr(node, "saved") and node.inputs == ()


def test_detach_cuts_the_graph_and_shares_the_data():
    x = leaf(randn(0, (3,)))
    h = x * 2.0
    d = h.detach()
    assert d._ctx is None and not d.requires_grad
    np.testing.assert_array_equal(d.numpy(), h.numpy())
    (h * d).sum().backward()                   # only the h path reaches x
    np.testing.assert_array_equal(grad_of(x), 2.0 * d.numpy())


def test_a_deep_chain_does_not_hit_the_recursion_limit():
    depth = max(5000, 3 * sys.getrecursionlimit())
    x = leaf(np.array([1.0, 2.0]))
    y = x
    for _ in range(depth):
        y = y * 1.0 + 0.0                      # 2 ops per step
    y.sum().backward()
    np.testing.assert_array_equal(grad_of(x), [1.0, 1.0])


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.array([1, 2, 3]), requires_grad=True)
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.array([True, False]), requires_grad=True)
    ids = Tensor(np.array([0, 1]))             # fine without grad
    assert not ids.requires_grad
    with pytest.raises(TypeError, match="floating-point"):
        ids.requires_grad_()
    assert not ids.requires_grad
    assert Tensor(np.array([1.0])).requires_grad_().requires_grad


def test_comparisons_give_boolean_tensors_outside_the_graph():
    x = leaf(randn(0, (4,)))
    mask = x > 0.0
    assert mask.dtype == np.bool_ and mask._ctx is None and not mask.requires_grad


# --------------------------------------------------------------------------
# Post-accumulate-grad hooks (what DDP's bucketing relies on)
# --------------------------------------------------------------------------

def make_layers(n_layers: int, width: int, seed: int):
    """(weight, bias) leaves of a chain of linear layers."""
    return [(leaf(randn(seed + 2 * i, (width, width)) * 0.5),
             leaf(randn(seed + 2 * i + 1, (width,))))
            for i in range(n_layers)]


def run_layers(layers, x):
    h = x
    for w, b in layers:
        h = ops.Linear.apply(h, w, b).tanh()
    return (h * h).sum()


@FAST
@given(n_layers=st.integers(1, 5), width=st.integers(1, 4), seed=seeds)
def test_hooks_fire_once_per_backward_after_grad_is_complete_last_layer_first(
        n_layers, width, seed):
    layers = make_layers(n_layers, width, seed)
    x = Tensor(randn(seed + 100, (3, width)))
    fired = []  # (layer, name, copy of .grad when the hook ran)

    def hook_for(i, name):
        return lambda t: fired.append((i, name, grad_of(t)))

    for i, (w, b) in enumerate(layers):
        w.register_post_accumulate_grad_hook(hook_for(i, "w"))
        b.register_post_accumulate_grad_hook(hook_for(i, "b"))

    for n_backward in (1, 2):
        fired.clear()
        run_layers(layers, x).backward()
        # once per leaf per backward
        assert sorted((i, n) for i, n, _ in fired) == sorted(
            (i, n) for i in range(n_layers) for n in "wb")
        # last layer first: the order in which DDP fills its buckets
        layer_order = [i for i, _, _ in fired]
        assert layer_order == sorted(layer_order, reverse=True)
        # and .grad was already complete: what the hook saw is the final value
        for i, name, seen in fired:
            w, b = layers[i]
            np.testing.assert_array_equal(seen, grad_of(w if name == "w" else b))


def test_hook_of_a_leaf_used_by_several_layers_fires_once_with_the_sum():
    w = leaf(randn(0, (3, 3)) * 0.5)
    x = Tensor(randn(1, (2, 3)))
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(grad_of(t)))
    h = ops.Linear.apply(x, w).tanh()
    h = ops.Linear.apply(h, w).tanh()          # the same weight, used again
    (h * h).sum().backward()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], grad_of(w))

    # the sum of both uses: compare with two separate copies of the weight
    w1, w2 = leaf(w.numpy()), leaf(w.numpy())
    h = ops.Linear.apply(ops.Linear.apply(x, w1).tanh(), w2).tanh()
    (h * h).sum().backward()
    np.testing.assert_allclose(seen[0], grad_of(w1) + grad_of(w2), rtol=1e-14, atol=1e-15)


def test_removed_hook_no_longer_fires():
    x = leaf(randn(0, (3,)))
    calls = []
    handle = x.register_post_accumulate_grad_hook(lambda t: calls.append(1))
    other = x.register_post_accumulate_grad_hook(lambda t: calls.append(2))
    (x * 2.0).sum().backward()
    assert calls == [1, 2]
    handle.remove()
    handle.remove()                            # removing twice is harmless
    (x * 2.0).sum().backward()
    assert calls == [1, 2, 2]
    other.remove()
    (x * 2.0).sum().backward()
    assert calls == [1, 2, 2]


def test_hooks_are_for_leaves_only():
    x = leaf(randn(0, (3,)))
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)


# --------------------------------------------------------------------------
# Custom Functions: the public extension API
# --------------------------------------------------------------------------

class Cube(Function):
    """y = x^3, dy/dx = 3 x^2."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved
        return grad * 3 * x * x


class ScaleBy(Function):
    """y = x * k for a number k given as a keyword (no gradient for it)."""

    @staticmethod
    def forward(ctx, x, k=1.0):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k


class Halves(Function):
    """Two outputs: the first and second half of a vector."""

    upstream_seen: list = []

    @staticmethod
    def forward(ctx, x):
        n = x.shape[0] // 2
        ctx.n = n
        return x[:n].copy(), x[n:].copy()

    @staticmethod
    def backward(ctx, g_first, g_second):
        Halves.upstream_seen.append((backend.to_host(g_first).copy(),
                                     backend.to_host(g_second).copy()))
        return xp.concatenate([g_first, g_second])


def test_custom_function_forward_and_backward():
    values = randn(0, (2, 3))
    x = leaf(values)
    y = Cube.apply(x)
    assert isinstance(y, Tensor) and y._ctx is not None
    np.testing.assert_array_equal(y.numpy(), values * values * values)
    y.sum().backward()
    np.testing.assert_array_equal(grad_of(x), 3 * values * values)
    assert minidist.gradcheck(Cube.apply, [leaf(values)])
    assert minidist.gradcheck(lambda t: ScaleBy.apply(t, k=2.5), [leaf(values)])


def test_custom_function_with_an_unused_output_gets_zeros_for_it():
    values = randn(0, (6,))
    x = leaf(values)
    first, second = Halves.apply(x)
    Halves.upstream_seen.clear()
    (first * 2.0).sum().backward()             # `second` never used
    (g_first, g_second), = Halves.upstream_seen
    np.testing.assert_array_equal(g_first, np.full(3, 2.0))
    np.testing.assert_array_equal(g_second, np.zeros(3))
    np.testing.assert_array_equal(grad_of(x), [2.0, 2.0, 2.0, 0.0, 0.0, 0.0])

    x.grad = None
    first, second = Halves.apply(x)
    (first.sum() + (second * 3.0).sum()).backward()  # both used
    np.testing.assert_array_equal(grad_of(x), [1.0, 1.0, 1.0, 3.0, 3.0, 3.0])


def test_custom_function_without_grad_returns_plain_tensors():
    x = Tensor(randn(0, (6,)))
    first, second = Halves.apply(x)
    assert first._ctx is None and second._ctx is None


class WrongShapeBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum(axis=0)

    @staticmethod
    def backward(ctx, grad):
        return grad                            # forgot to broadcast back to x's shape


class TooManyGradients(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2, grad


def test_a_bad_custom_backward_fails_with_a_clear_message():
    x = leaf(randn(0, (2, 3)))
    with pytest.raises(RuntimeError, match=r"WrongShapeBackward.backward returned a gradient "
                                           r"of shape \(3,\) for an input of shape \(2, 3\)"):
        WrongShapeBackward.apply(x).sum().backward()
    with pytest.raises(RuntimeError, match="TooManyGradients.backward returned 2 gradients "
                                           "for 1 inputs"):
        TooManyGradients.apply(x).sum().backward()


# --------------------------------------------------------------------------
# queue_callback: what runs when the outermost backward is done
# --------------------------------------------------------------------------

class Nested(Function):
    """y = 2x whose backward runs a backward of its own (as a recompute does) and queues
    a callback from inside it; every step of the way goes into LOG."""
    LOG: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        from minidist.autograd.engine import queue_callback
        inner = leaf(xp.ones(2))
        with enable_grad():
            (inner * 3).sum().backward()
        Nested.LOG.append("inner backward done")
        queue_callback(lambda: Nested.LOG.append("callback"),
                       on_error=lambda: Nested.LOG.append("on_error"))
        if Nested.raises:
            raise ValueError("a backward that fails")
        Nested.LOG.append("node done")
        return grad * 2


def test_a_queued_callback_runs_once_the_outermost_backward_is_done():
    from minidist.autograd.engine import queue_callback
    x = leaf(randn(0, (2,)))
    Nested.LOG.clear()
    Nested.raises = False
    loss = (Nested.apply(x) * x).sum()
    loss.backward()
    Nested.LOG.append("backward returned")
    # not when the inner backward ends, nor when the node does: after the last node
    assert Nested.LOG == ["inner backward done", "node done", "callback", "backward returned"]
    queue_callback(lambda: Nested.LOG.append("at once"))   # no backward running
    assert Nested.LOG[-1] == "at once"


def test_a_backward_that_raises_calls_on_error_instead_of_the_callback():
    x = leaf(randn(0, (2,)))
    Nested.LOG.clear()
    Nested.raises = True
    with pytest.raises(ValueError, match="a backward that fails"):
        Nested.apply(x).sum().backward()
    Nested.raises = False
    Nested.apply(x).sum().backward()         # the next backward: nothing left over
    assert Nested.LOG == ["inner backward done", "on_error",
                          "inner backward done", "node done", "callback"]
