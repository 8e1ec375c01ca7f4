"""The outer gradient's rounding: one power-of-two scale per tensor, then the format."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from minidist import backend
from minidist.parallel.diloco import round_outer_gradient
from minidist.parallel.diloco.outer_grad import outer_grad_format
from minidist.precision import quantize

FORMATS = ["bf16", "e4m3fn", "e5m2", "e2m1fn", "e3m0"]
small = arrays("float64", st.integers(1, 20), elements=st.floats(-1e-2, 1e-2, width=64))


@settings(max_examples=60, deadline=None)
@given(x=small, name=st.sampled_from(FORMATS))
def test_the_scale_is_the_smallest_power_of_two_that_fits_the_largest_value(x, name):
    fmt = outer_grad_format(name)
    x[np.abs(x) < 1e-200] = 0          # 2^k of a tiny amax would underflow in the oracle
    got = backend.to_host(round_outer_gradient(backend.from_host(x), fmt))
    amax = np.abs(x).max()
    if amax == 0:
        assert (got == 0).all()
        return
    k = 0
    while amax / 2.0 ** k > fmt.max:
        k += 1
    while amax / 2.0 ** (k - 1) <= fmt.max:
        k -= 1
    want = backend.to_host(quantize(backend.from_host(x / 2.0 ** k), fmt)) * 2.0 ** k
    np.testing.assert_array_equal(got, want)
    assert np.abs(got).max() <= fmt.max * 2.0 ** k


@settings(max_examples=30, deadline=None)
@given(x=arrays("float32", st.integers(1, 20), elements=st.floats(-1, 1, width=32)))
def test_bf16_under_a_power_of_two_scale_is_plain_bf16(x):
    x[np.abs(x) < 1e-30] = 0          # keep clear of float32 subnormals
    got = round_outer_gradient(backend.from_host(x), outer_grad_format("bf16"))
    np.testing.assert_array_equal(backend.to_host(got),
                                  backend.to_host(quantize(backend.from_host(x), "bf16")))
    assert backend.to_host(got).dtype == np.float32
