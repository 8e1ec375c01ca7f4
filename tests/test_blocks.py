"""Cache blocking (backend/blocks.py) changes the order of the sweeps, never a result.

A chain run block by block must give the bits of the same chain run on the whole
arrays: for sizes that straddle block edges, for an input of another layout (which
runs whole), and for what is built on it (GELU forward and backward, Adam's step,
quantize, attention's dropout hash). BLOCK_BYTES is made tiny here so that small arrays are cut into many
blocks with a ragged last one.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.autograd.ops.unary import Gelu
from minidist.backend import blocks as _blocks  # BLOCK_BYTES is patched on the module
from minidist.backend import xp
from minidist.optim.adam import adam_direction
from minidist.precision import quantize


def _chain(a, b, out, scratch):
    """out = tanh(a * b + 1) - a, through a scratch buffer."""
    xp.multiply(a, b, out=scratch)
    scratch += 1
    xp.tanh(scratch, out=out)
    out -= a


class _Ctx:
    def save_for_backward(self, *arrays):
        self.saved = arrays


def _gelu_both_ways(x, g, block_bytes, monkeypatch):
    monkeypatch.setattr(_blocks, "BLOCK_BYTES", block_bytes)
    ctx = _Ctx()
    y = Gelu.forward(ctx, x)
    return backend.to_host(y), backend.to_host(Gelu.backward(ctx, g))


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 200), transposed=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_blocked_chain_equals_whole_chain(n, transposed, seed):
    rng = np.random.default_rng(seed)
    a_host = rng.standard_normal((n, 3)).astype(np.float32)
    b_host = rng.standard_normal((n, 3)).astype(np.float32)
    a, b = backend.from_host(a_host), backend.from_host(b_host)
    if transposed:                                               # an input of another layout
        a = backend.from_host(np.ascontiguousarray(a_host.T)).T
    whole = xp.empty((n, 3), np.float32)
    _chain(a, b, whole, xp.empty((n, 3), np.float32))           # one call on the whole arrays
    out = xp.empty((n, 3), np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_blocks, "BLOCK_BYTES", 64)                # 16 float32 per block
        _blocks.blocked(_chain, a, b, out, xp.empty((n, 3), np.float32))
    np.testing.assert_array_equal(backend.to_host(out), backend.to_host(whole))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 64), (1000,)])
def test_gelu_in_blocks_equals_gelu_whole(dtype, shape, monkeypatch):
    rng = np.random.default_rng(7)
    x = backend.from_host(3 * rng.standard_normal(shape).astype(dtype))
    g = backend.from_host(rng.standard_normal(shape).astype(dtype))
    whole = _gelu_both_ways(x, g, 1 << 40, monkeypatch)
    blocks = _gelu_both_ways(x, g, 200, monkeypatch)             # ragged blocks of 25 or 50
    for got, want, what in zip(blocks, whole, ("forward", "backward")):
        np.testing.assert_array_equal(got, want, err_msg=f"gelu {what} in blocks")


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_step_in_blocks_equals_adam_step_whole(amsgrad, monkeypatch):
    rng = np.random.default_rng(3)
    draws = {name: rng.standard_normal(1000).astype(np.float32)
             for name in ("grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")}
    draws["exp_avg_sq"] **= 2                                    # second moments are >= 0
    draws["max_exp_avg_sq"] **= 2

    def direction(block_bytes):
        monkeypatch.setattr(_blocks, "BLOCK_BYTES", block_bytes)
        state = {name: backend.from_host(a.copy()) for name, a in draws.items()}  # updated in place
        out = adam_direction(state["grad"], state["exp_avg"], state["exp_avg_sq"], 5,
                             beta1=0.9, beta2=0.999, eps=1e-8, out=xp.empty(1000, np.float32),
                             max_exp_avg_sq=state["max_exp_avg_sq"] if amsgrad else None)
        return [backend.to_host(a) for a in (out, *state.values())]

    for got, want in zip(direction(200), direction(1 << 40)):
        np.testing.assert_array_equal(got, want)


def test_arrays_of_different_shapes_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        _blocks.blocked(_chain, xp.zeros((4, 3)), xp.zeros((4, 3)), xp.zeros((3, 4)),
                        xp.zeros((4, 3)))


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "e4m3fn", "e5m2"])
@pytest.mark.parametrize("saturate", [False, True])
def test_quantize_in_blocks_equals_quantize_whole(fmt, saturate, monkeypatch):
    rng = np.random.default_rng(11)
    host = (rng.standard_normal(1001) * 10.0 ** rng.integers(-9, 9, 1001)).astype(np.float32)
    host[:4] = [np.inf, -np.inf, np.nan, -0.0]
    x = backend.from_host(host)

    def rounded(block_bytes):
        monkeypatch.setattr(_blocks, "BLOCK_BYTES", block_bytes)
        return backend.to_host(quantize(x, fmt, saturate=saturate)).view(np.uint32)

    np.testing.assert_array_equal(rounded(200), rounded(1 << 40))


def test_blockwise_maps_a_function_block_by_block(monkeypatch):
    monkeypatch.setattr(_blocks, "BLOCK_BYTES", 40)              # blocks of 10 float32
    x = backend.from_host(np.arange(95, dtype=np.float32))
    seen = []

    def fn(block):
        seen.append(block.size)
        return block * 2 + 1

    got = backend.to_host(_blocks.blockwise(fn, x))
    np.testing.assert_array_equal(got, np.arange(95, dtype=np.float32) * 2 + 1)
    # CuPy runs every chain whole: on a GPU each block would cost a kernel launch per op
    assert seen == ([95] if backend.get_backend() == "cupy" else [10] * 9 + [5])


def test_attention_dropout_in_blocks_equals_dropout_whole(monkeypatch):
    from minidist.attention.common import dropout_scale

    def scale(block_bytes):
        monkeypatch.setattr(_blocks, "BLOCK_BYTES", block_bytes)
        return backend.to_host(dropout_scale(2024, 0.3, 3, (5, 22), (0, 19), 40, 19, "float32"))

    np.testing.assert_array_equal(scale(200), scale(1 << 40))   # uint64 blocks of 25
