"""MX, NVFP4 and blockwise FP8 quantization against references written from the specs.

The references below loop over blocks in plain NumPy + ml_dtypes, following the
OCP MX v1.0 conversion (section 6.3), NVIDIA's two-level NVFP4 recipe and
DeepSeek-V3's 1x128 / 128x128 FP8 scaling. hypothesis draws blocks whose amax
sits at binade edges, all-zero blocks, elements that land in the element
format's subnormals, and values that saturate. Where torchao runs, its
``to_mx`` and ``nvfp4_quantize`` are a second oracle, bit for bit.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.precision import (blockwise_fp8_dequantize, blockwise_fp8_quantize, encode,
                                mx_dequantize, mx_quantize, nvfp4_dequantize,
                                nvfp4_quantize)

from oracles.optional import require
from precision.helpers import same

ML = {"fp8_e4m3fn": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
      "fp6_e2m3fn": ml_dtypes.float6_e2m3fn, "fp6_e3m2fn": ml_dtypes.float6_e3m2fn,
      "fp4_e2m1fn": ml_dtypes.float4_e2m1fn}
EMAX = {"fp8_e4m3fn": 8, "fp8_e5m2": 15, "fp6_e2m3fn": 2, "fp6_e3m2fn": 4, "fp4_e2m1fn": 2}


def cast(v: np.ndarray, name: str) -> np.ndarray:
    """Round to the element format with saturation, by ml_dtypes."""
    top = float(ml_dtypes.finfo(ML[name]).max)
    return np.clip(v, -top, top).astype(ML[name]).astype(v.dtype)


def mx_reference(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """OCP MX v1.0, 6.3, one block of 32 at a time along the last axis (n % 32 == 0)."""
    blocks = x.reshape(-1, 32)
    elems, scales = np.zeros_like(blocks), np.zeros(len(blocks), np.float32)
    for i, v in enumerate(blocks):
        amax = float(np.max(np.abs(v)))
        if not math.isfinite(amax):
            scales[i] = np.nan                   # the spec's NaN scale; elements 0 here
            continue
        shared = math.frexp(amax)[1] - 1 - EMAX[name] if amax > 0 else -127
        shared = max(shared, -127)
        scales[i] = 2.0 ** shared
        elems[i] = cast(v / np.float64(2.0 ** shared), name)
    return elems.reshape(x.shape), scales.reshape(x.shape[:-1] + (-1,))


@st.composite
def mx_arrays(draw, rows=2, nblocks=2):
    """(rows, 32 * nblocks) float32: per block an amax at a binade edge and spread values."""
    out = np.zeros((rows, 32 * nblocks), np.float32)
    for r in range(rows):
        for b in range(nblocks):
            kind = draw(st.sampled_from(["zero", "edges", "spread", "one"]))
            if kind == "zero":
                continue
            e = draw(st.integers(-135, 125))
            edge = draw(st.sampled_from([1.0, 2 - 2.0 ** -23, 1.5, 1.75, 1.875, 1.9375, 1.25]))
            drops = draw(st.lists(st.integers(0, 40), min_size=32, max_size=32))
            mant = draw(st.lists(st.integers(0, 2 ** 23 - 1), min_size=32, max_size=32))
            signs = draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=32, max_size=32))
            v = np.array([s * (1 + m / 2 ** 23) * 2.0 ** (e - d) for s, m, d in
                          zip(signs, mant, drops)]) / 2
            if kind == "one":
                v[:] = 0
            v[draw(st.integers(0, 31))] = draw(st.sampled_from([1.0, -1.0])) * edge * 2.0 ** e
            out[r, 32 * b: 32 * (b + 1)] = v.astype(np.float32)
    return out


@pytest.mark.parametrize("name", list(ML))
@settings(max_examples=40, deadline=None)
@given(x=mx_arrays())
def test_mx_quantize_matches_the_spec(name, x):
    elems, scales = mx_quantize(backend.from_host(x), name)
    want_e, want_s = mx_reference(x, name)
    assert same(backend.to_host(scales), want_s)
    assert same(backend.to_host(elems), want_e)
    back = backend.to_host(mx_dequantize(elems, scales))
    assert same(back, (want_e.reshape(-1, 32) * want_s.reshape(-1, 1)).reshape(x.shape))


@pytest.mark.parametrize("name", ["fp8_e4m3fn", "fp4_e2m1fn"])
def test_mx_non_finite_blocks_get_a_nan_scale_and_others_are_untouched(name):
    x = np.ones((3, 64), np.float32)
    x[0, 5], x[1, 40] = np.nan, -np.inf
    elems, scales = mx_quantize(backend.from_host(x), name)
    s = backend.to_host(scales)
    assert np.isnan(s[0, 0]) and np.isnan(s[1, 1]) and np.isfinite(s[0, 1]) and np.isfinite(s[2]).all()
    back = backend.to_host(mx_dequantize(elems, scales))
    assert np.isnan(back[0, :32]).all() and (back[0, 32:] == 1).all() and (back[2] == 1).all()
    encode(elems, name)                           # the elements stay encodable (no NaN)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_mx_short_axis_is_zero_padded(axis):
    x = np.random.default_rng(0).standard_normal((40, 45)).astype(np.float32)
    elems, scales = mx_quantize(backend.from_host(x), "fp8_e4m3fn", axis=axis)
    n = x.shape[axis]
    padded = np.concatenate([x, np.zeros_like(x)], axis=axis).take(range(64), axis=axis)
    e2, s2 = mx_quantize(backend.from_host(padded), "fp8_e4m3fn", axis=axis)
    assert same(backend.to_host(elems), backend.to_host(e2).take(range(n), axis=axis))
    assert same(backend.to_host(scales), backend.to_host(s2))
    assert scales.shape[axis] == 2
    back = mx_dequantize(elems, scales, axis=axis)
    assert back.shape == x.shape


def test_mx_worked_block():
    x = np.zeros(32, np.float32)
    x[:4] = [10, -3, 0.7, 0.2]
    elems, scales = mx_quantize(backend.from_host(x), "e2m1fn")
    assert backend.to_host(scales).tolist() == [2.0]
    assert backend.to_host(elems)[:4].tolist() == [4.0, -1.5, 0.5, 0.0]
    assert backend.to_host(mx_dequantize(elems, scales))[:4].tolist() == [8.0, -3.0, 1.0, 0.0]


def test_mx_dequantize_of_quantize_is_a_fixed_point():
    x = backend.from_host(np.random.default_rng(1).standard_normal((4, 96)).astype(np.float32))
    for name in ML:
        y = mx_dequantize(*mx_quantize(x, name))
        assert same(backend.to_host(mx_dequantize(*mx_quantize(y, name))), backend.to_host(y))


def test_bad_input_is_refused_with_a_reason():
    x = backend.from_host(np.ones((2, 32), np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        mx_quantize(backend.from_host(np.ones((2, 32), np.int32)), "e4m3fn")
    with pytest.raises(ValueError, match="block_size=32"):
        mx_quantize(x, "e4m3fn", block_size=16)
    with pytest.raises(ValueError, match="not an MX element format"):
        mx_quantize(x, "bf16")
    with pytest.raises(ValueError, match="axis"):
        mx_quantize(x, "e4m3fn", axis=2)
    with pytest.raises(ValueError, match="need"):
        mx_dequantize(x, backend.from_host(np.ones((2, 2), np.float32)))
    with pytest.raises(ValueError, match="block_size=16"):
        nvfp4_quantize(x, block_size=32)
    with pytest.raises(TypeError, match="float32 or float64"):
        nvfp4_quantize(backend.from_host(np.ones((2, 32), np.int64)))
    with pytest.raises(ValueError, match="DeepSeek-V3"):
        blockwise_fp8_quantize(x, (32, 32))
    with pytest.raises(ValueError, match="at least 2 dims"):
        blockwise_fp8_quantize(backend.from_host(np.ones(128, np.float32)))


# -- NVFP4 -------------------------------------------------------------------------

def nvfp4_reference(x: np.ndarray):
    """NVIDIA's two-level recipe, one 16-block at a time along the last axis, float32."""
    f32 = np.float32
    amax = f32(np.max(np.abs(x[np.isfinite(x)]), initial=0))
    s_t = amax / f32(6 * 448) if amax > 0 else f32(1)
    blocks = x.reshape(-1, 16)
    elems, scales = np.zeros_like(blocks), np.zeros(len(blocks), f32)
    for i, v in enumerate(blocks):
        a = np.max(np.abs(v))
        if not np.isfinite(a):
            scales[i] = np.nan
            continue
        s_b = np.clip((a / f32(6)) / s_t, f32(2.0 ** -9), f32(448))
        s_b = f32(s_b.astype(ml_dtypes.float8_e4m3fn))
        scales[i] = s_b
        if a > 0:                                    # an all-zero block's elements stay 0
            elems[i] = cast(v * ((f32(1) / s_t) / s_b), "fp4_e2m1fn")
    return elems.reshape(x.shape), scales.reshape(x.shape[:-1] + (-1,)), s_t


@settings(max_examples=40, deadline=None)
@given(x=mx_arrays(rows=2, nblocks=2))
def test_nvfp4_matches_the_recipe(x):
    x = np.clip(x, -1e30, 1e30) * np.float32(2.0 ** -60)      # keep amax / 2688 a normal float32
    assume(np.abs(x).max() == 0 or np.abs(x).max() > 2.0 ** -90)   # see nvfp4.py: tiny tensors
    elems, scales, s_t = nvfp4_quantize(backend.from_host(x))
    we, ws, wt = nvfp4_reference(x)
    assert same(np.asarray(backend.to_host(s_t)).reshape(()), np.asarray(wt))
    assert same(backend.to_host(scales), ws) and same(backend.to_host(elems), we)
    back = backend.to_host(nvfp4_dequantize(elems, scales, s_t))
    want = (we.reshape(-1, 16) * (ws.reshape(-1, 1) * wt)).reshape(x.shape)
    assert same(back, want)


def test_nvfp4_nan_block_and_zero_tensor():
    x = np.ones((2, 32), np.float32)
    x[1, 3] = np.nan
    e, s, t = nvfp4_quantize(backend.from_host(x))
    s = backend.to_host(s)
    assert np.isnan(s[1, 0]) and np.isfinite(s[0]).all() and np.isfinite(s[1, 1])
    e, s, t = nvfp4_quantize(backend.from_host(np.zeros((2, 32), np.float32)))
    assert float(backend.to_host(t)) == 1.0 and not backend.to_host(e).any()


def test_nvfp4_stochastic_rounding_is_unbiased():
    x = np.full((1, 16 * 2000), 1.25, np.float32)
    x[0, ::16] = 6.0
    e, s, t = nvfp4_quantize(backend.from_host(x), rounding="stochastic", rng=backend.Generator(3))
    s, t = backend.to_host(s), float(backend.to_host(t))
    scaled = 1.25 * ((np.float32(1) / np.float32(t)) / s[0, 0])    # the same in every block
    got = backend.to_host(e)[0].reshape(-1, 16)[:, 1:]
    assert set(np.unique(got)) == {1.0, 1.5} and abs(got.mean() - scaled) < 0.01


# -- DeepSeek-V3 blockwise FP8 ---------------------------------------------------------

def blockwise_reference(x: np.ndarray, block) -> tuple[np.ndarray, np.ndarray]:
    b0, b1 = block
    r, c = x.shape
    nr, nc = -(-r // b0), -(-c // b1)
    elems, scales = np.zeros_like(x), np.zeros((nr, nc), np.float32)
    for i in range(nr):
        for j in range(nc):
            g = x[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            a = np.float32(np.max(np.abs(g)))
            if not np.isfinite(a):
                scales[i, j] = np.nan
                continue
            s = a / np.float32(448) if a > 0 else np.float32(1)
            scales[i, j] = s
            elems[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = cast(g / s, "fp8_e4m3fn")
    return elems, scales


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 140), cols=st.integers(1, 300), seed=st.integers(0, 2 ** 32 - 1),
       spread=st.integers(0, 30))
def test_blockwise_fp8_matches_deepseek_v3(block, rows, cols, seed, spread):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-spread, spread + 1, (rows, 1)))
         ).astype(np.float32)
    x[rng.random((rows, cols)) < 0.1] = 0
    elems, scales = blockwise_fp8_quantize(backend.from_host(x), block)
    we, ws = blockwise_reference(x, block)
    assert same(backend.to_host(scales), ws) and same(backend.to_host(elems), we)
    back = backend.to_host(blockwise_fp8_dequantize(elems, scales, block))
    assert same(back, we * np.repeat(np.repeat(ws, block[0], 0), block[1], 1)[:rows, :cols])


# -- torchao, a second oracle where it runs ----------------------------------------------

def torchao_or_skip():
    torch = require("torch")
    require("torchao")
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as ao_nvfp4
        to_mx(torch.ones(1, 32), torch.float8_e4m3fn, 32)
    except Exception as exc:                      # torchao unable to run on CPU
        pytest.skip(f"torchao's MX reference does not run here: {exc}")
    return torch, to_mx, ao_nvfp4


AO_DTYPES = {"fp8_e4m3fn": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "fp6_e2m3fn": "fp6_e2m3",
             "fp6_e3m2fn": "fp6_e3m2", "fp4_e2m1fn": "float4_e2m1fn_x2"}


def unpack_fp4(u: np.ndarray, shape) -> np.ndarray:
    return np.stack([u & 0xF, u >> 4], -1).reshape(shape)


@pytest.mark.parametrize("name", list(ML))
@settings(max_examples=25, deadline=None)
@given(x=mx_arrays())
def test_mx_quantize_equals_torchao_to_mx(name, x):
    torch, to_mx, _ = torchao_or_skip()
    amax = np.abs(x.reshape(-1, 32)).max(1)
    # torchao divides by 2^-126 where the scale is 2^-127: compare the other blocks
    keep = (amax == 0) | (np.frexp(amax)[1] - 1 - EMAX[name] > -127)
    dtype = getattr(torch, AO_DTYPES[name], AO_DTYPES[name])
    s, d = to_mx(torch.from_numpy(x), dtype, 32)
    elems, scales = mx_quantize(backend.from_host(x), name)
    codes = d.view(torch.uint8).numpy()
    if name == "fp4_e2m1fn":
        codes = unpack_fp4(codes, x.shape)
    ours = backend.to_host(encode(elems, name)).reshape(-1, 32)
    assert np.array_equal(ours[keep], codes.reshape(-1, 32)[keep])
    assert np.array_equal(backend.to_host(encode(scales, "e8m0fnu")).ravel(),
                          s.view(torch.uint8).numpy().ravel())


@settings(max_examples=25, deadline=None)
@given(x=mx_arrays(rows=2, nblocks=2))
def test_nvfp4_equals_torchao(x):
    torch, _, ao_nvfp4 = torchao_or_skip()
    x = np.clip(x, -1e30, 1e30) * np.float32(2.0 ** -60)
    assume(np.abs(x).max() > 2.0 ** -90)
    elems, scales, s_t = nvfp4_quantize(backend.from_host(x))
    ao_s, ao_d = ao_nvfp4(torch.from_numpy(x), 16, torch.tensor(float(backend.to_host(s_t))))
    # torchao clamps block scales to E4M3's smallest normal 2^-6; we use its subnormals too
    ours = backend.to_host(scales)
    keep = (ours >= 2.0 ** -6).ravel()
    assert np.array_equal(ours.ravel()[keep], ao_s.float().numpy().ravel()[keep])
    codes = unpack_fp4(ao_d.view(torch.uint8).numpy(), x.shape).reshape(-1, 16)
    assert np.array_equal(backend.to_host(encode(elems, "e2m1fn")).reshape(-1, 16)[keep],
                          codes[keep])


# -- the tensor type and its storage cost ----------------------------------------------

@pytest.mark.parametrize("recipe,calc_name", [("mxfp8", "mxfp8"), ("mxfp6", "mxfp6"),
                                              ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"),
                                              ("fp8_blockwise_tile", "fp8_blockwise_tile"),
                                              ("fp8_blockwise_block", "fp8_blockwise_block")])
def test_block_scaled_tensor_round_trips_and_reports_calcs_bits(recipe, calc_name):
    from minidist.calc import block_format_bits
    from minidist.precision import BlockScaledTensor
    x = backend.from_host(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32))
    t = BlockScaledTensor.quantize(x, recipe)
    assert t.bits_per_element == block_format_bits(calc_name, x.size)
    y = t.dequantize()
    again = backend.to_host(BlockScaledTensor.quantize(y, recipe).dequantize())
    if recipe.startswith("mx"):       # power-of-two scales: a fixed point, to the bit
        assert same(again, backend.to_host(y))
    else:                             # FP32 / E4M3 scales: the products round in float32
        np.testing.assert_allclose(again, backend.to_host(y), rtol=2e-7)
    assert {"mxfp8": 8.25, "mxfp4": 4.25, "nvfp4": 4.5 + 32 / x.size}.get(
        recipe, t.bits_per_element) == t.bits_per_element
