"""Float32 subnormals survive a backend that flushes them (CuPy's -ftz=true).

``widen`` / ``narrow`` / ``exp2_float32`` go through the bits where the backend
flushes; forced on here (on NumPy arrays), they must equal NumPy's exact casts
bit for bit. And the guard's imitation of the flush must be the split an H100
showed (scripts/ftz_probe.py): arithmetic, comparisons and float32 <-> float64
casts flush; copies, where, copysign and signbit keep the bits.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.backend import guard_ftz
from minidist.precision.subnormals import exp2_float32, narrow, widen

EDGES = np.array([0, 1, 0x80000001, 0x7FFFFF, 0x807FFFFF, 0x800000, 0x80000000,
                  0x7F800000, 0x7FC00000, 0x400000, 0x3F800000], np.uint32)


RANDOM_ARRAYS = settings(max_examples=20, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def flushing(monkeypatch):
    monkeypatch.setattr(backend, "flushes_subnormals", lambda: True)


def host(a):
    return backend.to_host(a)


@RANDOM_ARRAYS
@given(seed=st.integers(0, 2 ** 31))
def test_widen_is_exact_through_the_bits(flushing, seed):
    u = np.random.default_rng(seed).integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    u[::3] &= 0x807FFFFF                                         # a third subnormal (or zero)
    x = np.concatenate([EDGES, u]).view(np.float32)
    got = host(widen(backend.from_host(x)))
    assert got.dtype == np.float64
    want = x.astype(np.float64)
    np.testing.assert_array_equal(got.view(np.uint64)[~np.isnan(x)], want.view(np.uint64)[~np.isnan(x)])
    assert np.isnan(got[np.isnan(x)]).all()


@RANDOM_ARRAYS
@given(seed=st.integers(0, 2 ** 31))
def test_narrow_rounds_as_an_ieee_cast(flushing, seed):
    rng = np.random.default_rng(seed)
    y = rng.standard_normal(4096) * 2.0 ** rng.integers(-160, -110, 4096)
    ties = (rng.integers(0, 2 ** 23, 512) + 0.5) * 2.0 ** -149   # halfway between subnormals
    y = np.concatenate([y, ties, -ties, [2.0 ** -126 * (1 - 2 ** -25), -0.0, 0.0, 1.0, 1e300]])
    with np.errstate(over="ignore"):
        want = y.astype(np.float32)
    got = host(narrow(backend.from_host(y)))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_exp2_float32_builds_every_power_of_two(flushing):
    e = np.arange(-149, 128)
    got = host(exp2_float32(backend.from_host(e)))
    np.testing.assert_array_equal(got, np.ldexp(np.float32(1), e).astype(np.float32))


def test_the_guards_flush_is_the_split_an_h100_showed():
    sub = np.array([1e-45, -5.9e-39, 1.0], np.float32)
    guard_ftz.flush_subnormals(True)
    try:
        call = guard_ftz.flush_call
        flushed = [call(np.multiply, np.multiply, (sub, np.float32(1)), {}),
                   call(np.abs, np.abs, (sub,), {}), call(np.negative, np.negative, (sub,), {}),
                   guard_ftz.flush_cast(sub, "float64"),
                   guard_ftz.flush_cast(sub.astype(np.float64), "float32")]
        kept = [call(np.copysign, np.copysign, (sub, np.float32(-1)), {}),
                call(np.where, np.where, (sub == sub, sub, np.float32(0)), {}),
                call(np.signbit, np.signbit, (sub,), {})]
        equals_zero = call(np.equal, np.equal, (sub, np.float32(0)), {})
    finally:
        guard_ftz.flush_subnormals(False)
    for out in flushed:
        assert list(np.abs(out)) == [0, 0, 1] and np.signbit(out[:2]).tolist() in (
            [False, True], [True, False], [False, False])
    assert list(kept[0]) == list(-np.abs(sub)) and list(kept[1]) == list(sub)
    assert kept[2].tolist() == [False, True, False] and equals_zero.tolist() == [True, True, False]
