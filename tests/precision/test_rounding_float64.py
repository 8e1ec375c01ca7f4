"""quantize on float64 rounds once, from the exact value (no double rounding).

The oracle is ``exact_round``: the input as a Fraction, rounded with integer
arithmetic. Casting float64 -> float32 -> format rounds twice and gets the
"double-rounding" inputs wrong: a value just above a tie of the format whose
excess is below float32's precision lands exactly on the tie in float32 and
then goes to the even neighbour instead of up.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.precision import BF16, FP8_E4M3FN, FP16, FloatFormat, quantize, quantize_reference

from precision.helpers import MAIN, REFERENCE, exact_round, first_difference, same

FORMATS = list(REFERENCE) + [FloatFormat("e6m9", 6, 9), FloatFormat("e2m1fnuz", 2, 1, special="fnuz"),
                             FloatFormat("e5m10fn", 5, 10, special="fn"), FloatFormat("e11m20", 11, 20)]


def q64(values, fmt, **kw) -> np.ndarray:
    return backend.to_host(quantize(backend.from_host(np.array(values, dtype=np.float64)), fmt, **kw))


def check_exact(values, fmt, saturate=False) -> None:
    got = q64(values, fmt, saturate=saturate)
    want = np.array([exact_round(v, fmt, saturate) for v in values], dtype=np.float64)
    assert same(got, want), first_difference(np.array(values, np.float64), got, want)


def test_worked_example_bf16_double_rounding():
    x = 1 + 2.0 ** -8 + 2.0 ** -30
    assert q64([x], BF16)[0] == 1.0078125
    assert float(np.float32(x)) == 1 + 2.0 ** -8           # the float32 detour lands on a tie ...
    assert q64([float(np.float32(x))], BF16)[0] == 1.0     # ... which goes to the even 1.0


@st.composite
def near_ties(draw, fmt):
    """v + gap/2 +- a perturbation too small for float32 to see (2^-25 .. 2^-50 of the gap)."""
    e = draw(st.integers(fmt.emin - 1, fmt.emax))
    m = draw(st.integers(0, 2 ** fmt.man_bits - 1))
    gap = fmt.gap(e)
    v = 2.0 ** e + m * gap if e >= fmt.emin else m * gap
    tiny = gap * 2.0 ** -draw(st.integers(25, 50)) * draw(st.sampled_from([-1, 0, 1]))
    return draw(st.sampled_from([1, -1])) * (v + gap / 2 + tiny)


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@settings(max_examples=40)
@given(data=st.data())
def test_quantize_float64_is_exactly_rounded(fmt, data):
    values = data.draw(st.lists(st.one_of(near_ties(fmt), st.floats(width=64)),
                                min_size=1, max_size=40))
    saturate = data.draw(st.booleans())
    check_exact(values, fmt, saturate)


@pytest.mark.parametrize("fmt", MAIN, ids=str)
def test_quantize_float64_fast_path_matches_reference_path(fmt):
    u = np.random.default_rng(1).integers(0, 2 ** 64, 2 ** 20, dtype=np.uint64, endpoint=False)
    # random patterns are mostly huge or tiny: add patterns around the format's range
    near = np.random.default_rng(2).uniform(-fmt.emax - 2, fmt.emax + 2, 2 ** 18)
    x = np.concatenate([u.view(np.float64), np.exp2(near) * np.sign(np.sin(near * 1e3)),
                        np.exp2(np.floor(near)) * (1 + 2.0 ** -(fmt.man_bits + 1))])
    fast = backend.to_host(quantize(backend.from_host(x), fmt))
    slow = backend.to_host(quantize_reference(backend.from_host(x), fmt))
    assert same(fast, slow), first_difference(x, fast, slow)


def test_quantize_float64_to_fp16_matches_numpy_direct_cast():
    # NumPy converts float64 -> float16 in one rounding, so it is a second oracle
    x = np.exp2(np.random.default_rng(3).uniform(-30, 17, 2 ** 18))
    x *= 1 + np.random.default_rng(4).integers(-3, 4, x.size) * 2.0 ** -40
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float64)
    assert same(q64(x, FP16), want)


def test_double_rounding_cases_of_every_fp8_value():
    fmt = FP8_E4M3FN
    values = []
    for e in range(fmt.emin, fmt.emax + 1):
        for m in range(2 ** fmt.man_bits):
            gap = fmt.gap(e)
            mid = 2.0 ** e + (m + 0.5) * gap
            values += [mid + gap * 2.0 ** -30, mid - gap * 2.0 ** -30, mid]
    values = [v for v in values if v < 500] + [-v for v in values if v < 500]
    check_exact(values, fmt)
    assert not math.isnan(q64([464.0 - 2.0 ** -30], fmt)[0])
