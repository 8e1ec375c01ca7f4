"""The array backend: the switch, the guard's CuPy-like refusals, portable helpers."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.backend import GuardArray, xp
from minidist.backend.ordered_scatter import ordered_scatter_add


@pytest.fixture
def guard():
    """Switch to the guard backend for one test, then back."""
    before = backend.get_backend()
    backend.set_backend("guard")
    yield backend.xp
    backend.set_backend(before)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="numpy.*cupy.*guard"):
        backend.set_backend("jax")


def test_guard_refuses_implicit_host_conversion(guard):
    a = guard.ones((2, 3), dtype="float32")
    for convert in (np.asarray, np.array, np.ascontiguousarray):
        with pytest.raises(TypeError, match="Implicit conversion"):
            convert(a)


def test_guard_refuses_mixing_host_arrays_into_device_ops(guard):
    a = guard.ones(3)
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        a + np.ones(3)
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        guard.concatenate([a, np.ones(3)])
    with pytest.raises(AttributeError, match="Generator"):
        guard.random.rand(3)


def test_guard_allows_what_cupy_allows(guard):
    a = guard.arange(6, dtype="float32").reshape(2, 3)
    b = a * 2 + 1                                    # operators
    assert isinstance(b, GuardArray)
    assert isinstance(guard.exp(a), GuardArray)      # xp functions
    assert isinstance(b.sum(), GuardArray)           # reductions give 0-d arrays, as CuPy
    assert float(b.sum()) == 36.0                    # explicit scalar conversion
    b[0] = 7                                         # setitem
    assert backend.to_host(b)[0].tolist() == [7, 7, 7]
    idx = guard.asarray([1, 1, 0])
    assert b[idx].shape == (3, 3)                    # integer-array indexing
    assert isinstance(guard.asarray(np.ones(2)), GuardArray)  # explicit transfer


def test_to_host_and_from_host_round_trip():
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(backend.to_host(backend.from_host(host)), host)


def test_generator_draws_the_same_numbers_on_every_backend(guard):
    on_guard = backend.to_host(backend.Generator(5).normal((4, 3)))
    backend.set_backend("numpy")
    on_numpy = backend.to_host(backend.Generator(5).normal((4, 3)))
    np.testing.assert_array_equal(on_guard, on_numpy)


def test_generator_state_replays_draws():
    gen = backend.Generator(1)
    state = gen.get_state()
    first = backend.to_host(gen.random((5,)))
    gen.set_state(state)
    np.testing.assert_array_equal(backend.to_host(gen.random((5,))), first)


@given(st.lists(st.integers(0, 4), min_size=1, max_size=20))
def test_scatter_add_sums_repeated_indices(indices):
    target = xp.zeros((5, 2), dtype="float64")
    values = backend.from_host(np.ones((len(indices), 2)))
    backend.scatter_add(target, backend.from_host(np.array(indices)), values)
    expected = np.zeros((5, 2))
    np.add.at(expected, indices, 1.0)
    np.testing.assert_array_equal(backend.to_host(target), expected)


@given(indices=st.lists(st.integers(-5, 4), max_size=30), row=st.sampled_from([(), (3,), (2, 2)]),
       dtype=st.sampled_from(["float16", "float32", "float64"]), seed=st.integers(0, 99))
def test_ordered_scatter_add_has_the_bits_of_numpy_add_at(indices, row, dtype, seed):
    """Repeats added one after another in their order: np.add.at's bits, not an atomic
    add's (on CuPy the kernel runs; on the CPU backends the kernel's loop, its oracle)."""
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((5,) + row).astype(dtype)
    values = rng.standard_normal((len(indices),) + row).astype(dtype)
    expected = target.copy()
    np.add.at(expected, np.array(indices, dtype="int64"), values)
    got = backend.from_host(target)
    ordered_scatter_add(got, backend.from_host(np.array(indices, dtype="int64")),
                        backend.from_host(values), on_gpu=backend.get_backend() == "cupy")
    unsigned = f"uint{8 * target.itemsize}"
    np.testing.assert_array_equal(backend.to_host(got).view(unsigned), expected.view(unsigned))


def test_device_type_is_what_init_device_mesh_expects():
    assert backend.device_type() == ("cpu" if backend.get_backend() == "numpy" else "cuda")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_bits_round_trip(dtype):
    x = backend.from_host(np.array([0.0, -0.0, 1.5, np.inf, -2.25], dtype=dtype))
    u = backend.bits(x)
    assert u.dtype.itemsize == x.dtype.itemsize and u.dtype.kind == "u"
    np.testing.assert_array_equal(backend.to_host(backend.from_bits(u, dtype)), backend.to_host(x))


def test_memory_tracker_sees_an_allocation():
    with backend.MemoryTracker() as small:
        a = xp.ones(1000, dtype="float64")
    with backend.MemoryTracker() as big:
        b = xp.ones(1_000_000, dtype="float64")
    assert big.peak >= 8_000_000 > small.peak
    del a, b


def test_timer_measures_elapsed_time():
    with backend.Timer() as t:
        sum(range(10000))
    assert t.seconds > 0


def test_matmul_flop_counter_counts_2mnk_per_product_and_restores_xp():
    from minidist.backend import MatmulFlopCounter, xp
    a = xp.ones((3, 4, 5))
    b = xp.ones((5, 6))
    with MatmulFlopCounter() as counter:
        xp.matmul(a, b)
        xp.matmul(b.T, b)
    assert counter.flops == 2 * 3 * 4 * 6 * 5 + 2 * 6 * 6 * 5 and counter.calls == 2
    xp.matmul(a, b)
    assert counter.flops == 2 * 3 * 4 * 6 * 5 + 2 * 6 * 6 * 5
