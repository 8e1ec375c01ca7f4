"""quantize on float32 agrees bit for bit with the reference casts.

References: NumPy's float16 cast and ml_dtypes' bfloat16 / fp8 casts, all
correctly rounded from float32. Inputs: hypothesis-drawn bit patterns, exact
ties between neighbours (and one float32 ulp either side), subnormals of the
format, overflow and specials; and a sweep of every 2^16 top half of a float32
with the low halves that hold the rounding decisions, plus 2^22 random patterns.
The fast paths are also checked against the frexp / rint reference path.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.precision import quantize, quantize_reference

from precision.helpers import (MAIN, REFERENCE, first_difference, quantize_host,
                               reference_cast, same)

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 448.0, 464.0, 465.0, 480.0,
                     57344.0, 61440.0, 61439.99, 65504.0, 65519.99, 65520.0, 3.4e38,
                     1.4e-45, 1e-40, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                     2.0 ** -9, 2.0 ** -10, 2.0 ** -17, 2.0 ** -16 * 1.5], dtype=np.float32)


def ties_of(fmt, codes: np.ndarray) -> np.ndarray:
    """Midpoints between consecutive finite values of fmt, and one float32 ulp either side."""
    ref = REFERENCE[fmt]
    udt = "u1" if np.dtype(ref).itemsize == 1 else "u2"
    with np.errstate(invalid="ignore"):
        lo = codes.astype(udt).view(ref).astype(np.float64)
        hi = (codes + 1).astype(udt).view(ref).astype(np.float64)
    ok = np.isfinite(lo) & np.isfinite(hi) & (np.sign(lo) == np.sign(hi))
    mid = ((lo[ok] + hi[ok]) / 2).astype(np.float32)          # exact: M <= 22
    up = np.nextafter(mid, np.float32(np.inf))
    down = np.nextafter(mid, np.float32(-np.inf))
    return np.concatenate([mid, up, down])


def check(x: np.ndarray, fmt) -> None:
    got, want = quantize_host(x, fmt), reference_cast(x, fmt)
    assert got.dtype == np.float32
    assert same(got, want), first_difference(x, got, want)


@pytest.mark.parametrize("fmt", list(REFERENCE), ids=str)
@settings(max_examples=60)
@given(patterns=st.lists(st.integers(0, 2 ** 32 - 1), min_size=1, max_size=200),
       codes=st.lists(st.integers(0, 2 ** 16 - 2), min_size=1, max_size=50))
def test_quantize_float32_matches_reference_cast(fmt, patterns, codes):
    codes = np.array(codes) % (2 ** fmt.bits - 1)
    x = np.concatenate([np.array(patterns, dtype=np.uint32).view(np.float32),
                        ties_of(fmt, codes), SPECIALS, -SPECIALS])
    check(x, fmt)


@pytest.mark.parametrize("fmt", list(REFERENCE), ids=str)
def test_quantize_float32_every_tie_matches_reference_cast(fmt):
    check(ties_of(fmt, np.arange(2 ** fmt.bits - 1)), fmt)


def sweep_patterns() -> np.ndarray:
    """Every top half x the low halves where fp16's and bf16's decisions lie, + random."""
    high = np.arange(2 ** 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x3001, 0x7FFF, 0x8000,
                     0x8001, 0xFFFF, 0x5A5A], dtype=np.uint32)
    grid = (high[:, None] | lows[None, :]).ravel()
    rand = np.random.default_rng(0).integers(0, 2 ** 32, 2 ** 22, dtype=np.uint64)
    return np.concatenate([grid, rand.astype(np.uint32)]).view(np.float32)


SWEEP = sweep_patterns()


@pytest.mark.parametrize("fmt", list(REFERENCE), ids=str)
def test_quantize_float32_sweep_matches_reference_cast(fmt):
    check(SWEEP, fmt)


@pytest.mark.parametrize("fmt", MAIN, ids=str)
@pytest.mark.parametrize("saturate", [False, True])
def test_fast_path_matches_reference_path(fmt, saturate):
    x = backend.from_host(SWEEP[: 2 ** 20])
    fast = backend.to_host(quantize(x, fmt, saturate=saturate))
    slow = backend.to_host(quantize_reference(x, fmt, saturate=saturate))
    assert same(fast, slow), first_difference(backend.to_host(x), fast, slow)


def test_quantize_returns_a_new_array_and_leaves_input_alone():
    host = SPECIALS.copy()
    x = backend.from_host(host)
    for fmt in MAIN:
        y = quantize(x, fmt)
        assert y is not x
        assert np.array_equal(backend.to_host(x).view(np.uint32), host.view(np.uint32))
