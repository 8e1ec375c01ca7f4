"""Properties of quantize that hold for every format: idempotent, monotone,
sign-symmetric, nearest, ties to even; stochastic rounding is unbiased; and it
refuses bad input loudly."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.precision import (FP8_E4M3FNUZ, FP8_E5M2, FP16, FloatFormat, decode, encode,
                                quantize)

from precision.helpers import MAIN, REFERENCE, quantize_host, same

FORMATS = MAIN + [FP8_E4M3FNUZ, FloatFormat("e3m2", 3, 2), FloatFormat("e6m5fn", 6, 5, special="fn")]
floats32 = st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=100)


def f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@given(values=st.lists(st.floats(width=32), min_size=1, max_size=100), saturate=st.booleans())
def test_idempotent(fmt, values, saturate):
    once = quantize_host(f32(values), fmt, saturate=saturate)
    assert same(quantize_host(once, fmt, saturate=saturate), once)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@given(values=floats32)
def test_monotone(fmt, values):
    x = np.sort(f32(values))
    y = quantize_host(x, fmt, saturate=True)     # saturating: overflow stays ordered
    assert np.all(np.diff(y.astype(np.float64)) >= 0)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@given(values=st.lists(st.floats(width=32), min_size=1, max_size=100), saturate=st.booleans())
def test_sign_symmetric(fmt, values, saturate):
    x = f32(values)
    a, b = quantize_host(-x, fmt, saturate=saturate), -quantize_host(x, fmt, saturate=saturate)
    assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@given(values=floats32)
def test_nearest_error_at_most_half_a_gap(fmt, values):
    x = f32(values)
    x = x[np.abs(x) <= fmt.max]
    y = quantize_host(x, fmt)
    exponent = np.floor(np.log2(np.abs(x.astype(np.float64)), where=x != 0, out=np.zeros(x.size)))
    gap = np.exp2(np.maximum(exponent, fmt.emin) - fmt.man_bits)
    assert np.all(np.abs(y.astype(np.float64) - x) <= gap / 2)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_ties_go_to_the_even_neighbour(fmt):
    codes = np.arange(2 ** (fmt.bits - 1) - 1, dtype=fmt.code_dtype)   # positive codes
    lo = backend.to_host(decode(backend.from_host(codes), fmt, "float64"))
    hi = backend.to_host(decode(backend.from_host(codes + 1), fmt, "float64"))
    ok = np.isfinite(lo) & np.isfinite(hi)
    mid = ((lo[ok] + hi[ok]) / 2).astype(np.float32)
    mid = mid[mid <= fmt.max]
    got = backend.to_host(encode(backend.from_host(mid), fmt))
    assert np.all(got % 2 == 0), "a tie went to an odd mantissa"


def test_saturate_clamps_overflow_and_inf_keeps_nan():
    x = f32([1e6, -1e6, np.inf, -np.inf, np.nan, 449.0, 100.0])
    y = quantize_host(x, "e4m3fn", saturate=True)
    assert y[:4].tolist() == [448.0, -448.0, 448.0, -448.0] and np.isnan(y[4])
    assert y[5:].tolist() == [448.0, 96.0]
    assert quantize_host(x, "e5m2")[:4].tolist() == [np.inf, -np.inf, np.inf, -np.inf]
    assert np.isnan(quantize_host(x, "e4m3fn")[:5]).all()


def test_fnuz_formats_have_no_negative_zero():
    y = quantize_host(f32([-0.0, -1e-30, -1e-4]), FP8_E4M3FNUZ)
    assert not np.signbit(y).any()


def test_stochastic_rounding_is_unbiased():
    """Each x sits a fraction p of the gap above its lower neighbour; over n draws
    the count rounded up is Binomial(n, p). The test fails if the count is more
    than 6 standard deviations from n p: for each of the 4 cases that happens by
    chance with probability < 2e-9, so a false failure has probability < 1e-8."""
    n = 200_000
    for p in (0.1, 0.5, 0.9, 2.0 ** -10):
        lo = 1.0 + 5 * 2.0 ** -10                  # an fp16 value; fp16's gap here is 2^-10
        x = np.full(n, lo + p * 2.0 ** -10, dtype=np.float32)
        y = quantize_host(x, FP16, rounding="stochastic", rng=backend.Generator(7))
        up = y == np.float32(lo + 2.0 ** -10)
        assert np.all(up | (y == np.float32(lo))), "stochastic rounding must pick a neighbour"
        assert abs(up.sum() - n * p) <= 6 * math.sqrt(n * p * (1 - p)), (p, up.mean())


def test_stochastic_rounding_keeps_representable_values_and_is_seeded():
    x = np.exp2(np.random.default_rng(0).uniform(-20, 15, 10_000)).astype(np.float32)
    y = quantize_host(x, FP8_E5M2)
    assert same(quantize_host(y, FP8_E5M2, rounding="stochastic", rng=backend.Generator(1)), y)
    a = quantize_host(x, FP8_E5M2, rounding="stochastic", rng=backend.Generator(3))
    b = quantize_host(x, FP8_E5M2, rounding="stochastic", rng=backend.Generator(3))
    assert same(a, b)


@settings(max_examples=30)
@given(values=floats32)
def test_stochastic_rounding_lands_on_a_neighbour(values):
    x = np.abs(f32(values))
    x = x[x <= FP16.max]
    y = quantize_host(x, FP16, rounding="stochastic", rng=backend.Generator(0))
    # the two neighbours of x, from the nearest value's code and the code beside it
    near = quantize_host(x, FP16)
    code = backend.to_host(encode(backend.from_host(near), FP16)).astype(np.int64)
    other = np.where(near >= x, np.maximum(code - 1, 0), code + 1).astype(np.uint16)
    other = backend.to_host(decode(backend.from_host(other), FP16))
    assert np.all((y == near) | (y == other))
    assert np.all(y[near == x] == x[near == x])


def test_bad_input_is_refused():
    x = backend.from_host(f32([1.0]))
    with pytest.raises(TypeError, match="float32 or float64"):
        quantize(backend.from_host(np.array([1, 2])), "fp16")
    with pytest.raises(TypeError, match="float32 or float64"):
        quantize(backend.from_host(np.array([1.0], np.float16)), "bf16")
    with pytest.raises(TypeError, match="array of the active backend"):
        quantize([1.0, 2.0], "fp16")
    with pytest.raises(ValueError, match="unknown float format"):
        quantize(x, "fp7")
    with pytest.raises(ValueError, match="rounding"):
        quantize(x, "fp16", rounding="up")
    with pytest.raises(ValueError, match="stochastic"):
        quantize(x, "fp16", rng=backend.Generator(0))
    with pytest.raises(ValueError, match="cannot hold exactly"):
        quantize(x, FloatFormat("e9m10", 9, 10))
    wide = quantize(backend.from_host(np.array([1e60])), FloatFormat("e9m10", 9, 10))
    assert backend.to_host(wide).dtype == np.float64


def test_reference_formats_cover_the_presets():
    assert set(MAIN) <= set(REFERENCE)
