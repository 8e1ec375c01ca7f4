"""The block-scaled Linear: its matmuls are float32 matmuls of the block-quantized
operands, exactly; its gradients are the exact ones where quantization is the
identity (finite differences as the oracle); DDP equals one process.

The backward is the straight-through gradient of the quantized Linear (the
quantized function itself is piecewise constant). On operands whose values lie
on every blocking's grid (powers of two 0.5 .. 4: exact in E2M1 and E4M3
under any power-of-two scale a block of them gets), Q is the identity, so the
forward equals x W^T + b and the backward equals the exact gradient, which
central finite differences of the float64 function give.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import Tensor, backend
from minidist.comm import World
from minidist.nn import functional as F
from minidist.precision import (BlockScaling, autocast, block_autocast, blockwise_fp8_dequantize,
                                blockwise_fp8_quantize, mx_dequantize, mx_quantize,
                                nvfp4_dequantize, nvfp4_quantize)
from minidist.precision.block_linear import RECIPES, hadamard_rows

from precision import block_cases
from precision.helpers import same


def q(a, axis, recipe, role):
    """The recipe's quantize-dequantize, written again from the public functions."""
    return backend.to_host(_q(backend.from_host(a), axis, recipe, role))


def _q(a, axis, recipe, role):
    if recipe.startswith("mx"):
        fmt = "e4m3fn" if recipe == "mxfp8" else "e2m1fn"
        return mx_dequantize(*mx_quantize(a, fmt, axis=axis), axis=axis)
    if recipe == "nvfp4":
        return nvfp4_dequantize(*nvfp4_quantize(a, axis=axis), axis=axis)
    if role == "w":
        return blockwise_fp8_dequantize(*blockwise_fp8_quantize(a, (128, 128)), (128, 128))
    t = a if axis == -1 else backend.from_host(np.ascontiguousarray(backend.to_host(a).T))
    out = backend.to_host(blockwise_fp8_dequantize(*blockwise_fp8_quantize(t)))
    return backend.from_host(out if axis == -1 else np.ascontiguousarray(out.T))  # BlockScaling's layout


def run(recipe, x, w, b, c, **kw):
    xt, wt, bt = (Tensor(backend.from_host(a), requires_grad=True) for a in (x, w, b))
    with block_autocast(BlockScaling(recipe, **kw)):
        y = F.linear(xt, wt, bt)
    (y * Tensor(backend.from_host(c))).sum().backward()
    return [backend.to_host(t) for t in (y.data, xt.grad, wt.grad, bt.grad)]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("hadamard", [False, True])
@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 70), d_in=st.integers(1, 150), d_out=st.integers(1, 40),
       seed=st.integers(0, 2 ** 20))
def test_matmuls_equal_float32_matmuls_of_the_quantized_operands(recipe, hadamard, n, d_in,
                                                                 d_out, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    w = rng.standard_normal((d_out, d_in)).astype(np.float32)
    b = rng.standard_normal(d_out).astype(np.float32)
    c = rng.standard_normal((n, d_out)).astype(np.float32)   # c = dL/dy
    y, gx, gw, gb = run(recipe, x, w, b, c, hadamard=hadamard)
    assert same(y, matmul(q(x, -1, recipe, "x"), q(w, -1, recipe, "w"), "a @ b.T") + b)
    assert same(gx, matmul(q(c, -1, recipe, "grad"), q(w, 0, recipe, "w")))
    if hadamard:
        h = BlockScaling(recipe, hadamard=True).h
        c, x = (backend.to_host(hadamard_rows(backend.from_host(a), h)) for a in (c, x))
    assert same(gw, matmul(q(c, 0, recipe, "grad"), q(x, 0, recipe, "x"), "a.T @ b"))
    assert same(gb, backend.to_host(backend.from_host(c[:n]).sum(axis=0)) if not hadamard else gb)


def matmul(a, b, form="a @ b"):
    """The float32 matmul on the backend under test, its operands laid out as the op's
    are (a GPU's BLAS sums in an order of its own, which NumPy's does not share)."""
    a, b = backend.from_host(a), backend.from_host(b)
    return backend.to_host({"a @ b": lambda: a @ b, "a @ b.T": lambda: a @ b.T,
                            "a.T @ b": lambda: a.T @ b}[form]())


GRID = np.array([0, 0.5, 1, 2, 4, -0.5, -1, -2, -4])


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4"])
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2 ** 20), n=st.integers(1, 40), d_in=st.integers(1, 70),
       d_out=st.integers(1, 40))
def test_gradients_on_the_grid_equal_finite_differences(recipe, seed, n, d_in, d_out):
    rng = np.random.default_rng(seed)
    x, w, c = (rng.choice(GRID, s) for s in ((n, d_in), (d_out, d_in), (n, d_out)))
    b = rng.standard_normal(d_out)
    y, gx, gw, gb = run(recipe, x, w, b, c)
    assert same(y, x @ w.T + b)

    def loss(x_, w_, b_):
        return float(np.sum((x_ @ w_.T + b_) * c))

    h = 2.0 ** -8
    for grad, arg in ((gx, 0), (gw, 1), (gb, 2)):
        args = [x, w, b]
        fd = np.zeros_like(args[arg])
        for i in np.ndindex(fd.shape):
            up, down = [a.copy() for a in args], [a.copy() for a in args]
            up[arg][i] += h
            down[arg][i] -= h
            fd[i] = (loss(*up) - loss(*down)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-12, atol=1e-9)


def test_hadamard_is_orthogonal_and_keeps_g_transpose_x():
    h = backend.to_host(BlockScaling("nvfp4", hadamard=True).h)
    assert np.allclose(h @ h.T, np.eye(16), atol=1e-7)
    rng = np.random.default_rng(0)
    g, x = rng.standard_normal((37, 5)), rng.standard_normal((37, 3))
    h64 = backend.from_host(h.astype(np.float64))
    gh, xh = (backend.to_host(hadamard_rows(backend.from_host(a), h64)) for a in (g, x))
    assert np.allclose(gh.T @ xh, g.T @ x)


def test_keep_bf16_weights_run_under_bf16_autocast():
    rng = np.random.default_rng(0)
    x = Tensor(backend.from_host(rng.standard_normal((4, 32)).astype(np.float32)))
    w = Tensor(backend.from_host(rng.standard_normal((8, 32)).astype(np.float32)))
    with block_autocast(BlockScaling("nvfp4", keep_bf16=[w])):
        y = F.linear(x, w)
    with autocast("bf16"):
        want = F.linear(x, w)
    assert same(backend.to_host(y.data), backend.to_host(want.data))


def test_stochastic_gradients_are_unbiased():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    c = rng.standard_normal((64, 16)).astype(np.float32)
    mean = np.mean([run("nvfp4", x, w, np.zeros(16, np.float32), c, stochastic_grad=True,
                        seed=s)[1] for s in range(200)], 0)
    exact = c @ backend.to_host(q(w, 0, "nvfp4", "w"))
    nearest = run("nvfp4", x, w, np.zeros(16, np.float32), c)[1]
    assert np.abs(mean - exact).mean() < 0.5 * np.abs(nearest - exact).mean()


def test_bad_recipe_is_refused():
    with pytest.raises(ValueError, match="mxfp8"):
        BlockScaling("mxfp16")


@pytest.fixture(scope="module")
def world2():
    w = World(2, timeout=20.0, run_timeout=120.0)
    yield w
    w.close()


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4"])
def test_ddp_equals_one_process(world2, recipe):
    """Each rank's 32 tokens fill whole blocks along N, and 1/2 of the mean is a
    power of two (MX scales absorb it exactly): the gradients agree up to float32
    summation order."""
    case = dict(seed=3, world=2, tokens=32, recipe=recipe)
    want = block_cases.single(case)
    for got in world2.run(block_cases.on_rank, case):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_zero_step_equals_one_process(world2, strategy):
    """ZeRO-2 and ZeRO-3 with MXFP8 Linears: one SGD step gives one process's parameters,
    up to float32 summation order. (ZeRO-3 recomputes each unit's forward inside
    backward, after the autocast block has closed, under the recipe captured at
    forward time.)"""
    case = dict(seed=4, world=2, tokens=32, recipe="mxfp8", strategy=strategy)
    want = block_cases.single_step(case)
    for got in world2.run(block_cases.zero_step_on_rank, case):
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
