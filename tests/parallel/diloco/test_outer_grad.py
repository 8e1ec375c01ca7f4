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


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       name=st.sampled_from(FORMATS), seed=st.integers(0, 2**16))
def test_the_wire_holds_bits_per_value_and_decodes_to_the_rounded_outer_gradient(sizes, name,
                                                                                  seed):
    """encode_outer_gradients sends ceil(n * bits / 8) bytes of codes and 4 per tensor;
    decoding one replica's wire gives round_outer_gradient's values, bit for bit."""
    from minidist.parallel.diloco.outer_grad import encode_outer_gradients, mean_of_encoded
    fmt = outer_grad_format(name)
    rng = np.random.default_rng(seed)
    deltas = [backend.from_host(rng.standard_normal(n) * 10.0 ** rng.integers(-6, 1))
              for n in sizes]
    wire = encode_outer_gradients(deltas, fmt)
    n = sum(sizes)
    assert wire.size == -(-n * fmt.bits // 8) + 4 * len(sizes)
    got = backend.to_host(mean_of_encoded(wire[None, :], sizes, fmt, "float64"))
    want = np.concatenate([backend.to_host(round_outer_gradient(d, fmt)) for d in deltas])
    np.testing.assert_array_equal(got, want)


def test_the_mean_of_wires_adds_the_replicas_in_rank_order():
    from minidist.parallel.diloco.outer_grad import encode_outer_gradients, mean_of_encoded
    fmt = outer_grad_format("e2m1fn")
    rows = [[backend.from_host(np.array([0.5, -3.0, 1e-3])), backend.from_host(np.array([2.0]))],
            [backend.from_host(np.array([1.5, 6.0, 0.0])), backend.from_host(np.array([-4.0]))]]
    wires = backend.xp.stack([encode_outer_gradients(r, fmt) for r in rows])
    got = backend.to_host(mean_of_encoded(wires, [3, 1], fmt, "float64"))
    want = sum(np.concatenate([backend.to_host(round_outer_gradient(d, fmt)) for d in r])
               for r in rows) / 2
    np.testing.assert_array_equal(got, want)
