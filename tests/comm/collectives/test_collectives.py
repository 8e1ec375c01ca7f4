"""Every collective, algorithm and op equals the one-process NumPy reference,
over world sizes 1..8, random shapes and dtypes (hypothesis).

The world of each size stays up while hypothesis sends it examples; each
example runs on every rank and the parent compares every rank's result with
``cases.expected`` bit for bit (inputs are small integers, so the order of
additions does not matter).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .. import cases
from .test_check import MISMATCHES, _mismatches

EXAMPLES = 5


@st.composite
def case_for(draw, collective, world):
    ndim = draw(st.integers(0, 2))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim)))
    if draw(st.integers(0, 9)) == 0:  # now and then, one that spans several slots
        shape = (draw(st.integers(1000, 5000)),)
    case = dict(collective=collective, world=world, shape=shape,
                dtype=draw(st.sampled_from(cases.DTYPES)),
                op=draw(st.sampled_from(cases.OPS)),
                algorithm=draw(st.sampled_from(cases.ALGORITHMS)),
                root=draw(st.integers(0, world - 1)),
                seed=draw(st.integers(0, 2**30)))
    return case


def check(worlds, case):
    results = worlds.get(case["world"]).run(cases.run_case, case)
    want = cases.expected(case)
    for rank, (got, exp) in enumerate(zip(results, want)):
        assert cases.same(got, exp), f"rank {rank} of {case}:\n got {got}\n want {exp}"
    return results


def _property(collective):
    @settings(max_examples=EXAMPLES, deadline=None)
    @given(data=st.data())
    def test(worlds, world_size, data):
        check(worlds, data.draw(case_for(collective, world_size)))
    test.__name__ = f"test_{collective}_matches_numpy_reference"
    return test


test_broadcast_matches_numpy_reference = _property("broadcast")
test_reduce_matches_numpy_reference = _property("reduce")
test_all_gather_matches_numpy_reference = _property("all_gather")
test_all_gather_into_tensor_matches_numpy_reference = _property("all_gather_into_tensor")
test_reduce_scatter_matches_numpy_reference = _property("reduce_scatter")
test_reduce_scatter_tensor_matches_numpy_reference = _property("reduce_scatter_tensor")
test_gather_matches_numpy_reference = _property("gather")
test_scatter_matches_numpy_reference = _property("scatter")
test_all_to_all_matches_numpy_reference = _property("all_to_all")
test_barrier_returns_on_every_rank = _property("barrier")


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_all_reduce_matches_numpy_reference(worlds, world_size, data):
    """Every algorithm x op x dtype, integer-valued so every order is exact."""
    check(worlds, data.draw(case_for("all_reduce", world_size)))


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_all_reduce_is_bitwise_identical_on_every_rank(worlds, world_size, data):
    """Real-valued floats: the sum depends on the order, yet every rank gets the same bits."""
    case = data.draw(case_for("all_reduce", world_size))
    case.update(real=True, op="SUM", dtype=data.draw(st.sampled_from(["float16", "float32",
                                                                      "float64"])))
    results = worlds.get(world_size).run(cases.run_case, case)
    for rank in range(1, world_size):
        assert cases.same(results[rank], results[0]), f"rank {rank} differs from rank 0"
    assert cases.close(results[0], cases.expected(case)[0])


def test_all_reduce_of_a_strided_array_writes_back(worlds):
    def fn():
        import minidist.distributed as dist
        from minidist import backend
        x = backend.from_host(np.arange(12.0).reshape(3, 4)).T  # not contiguous
        dist.all_reduce(x, algorithm="ring")
        return backend.to_host(x).copy()
    results = worlds.get(3).run(fn)
    for got in results:
        assert np.array_equal(got, 3 * np.arange(12.0).reshape(3, 4).T)


def test_every_mismatch_is_an_error_on_every_rank_and_the_world_goes_on(worlds, world_size):
    """The pairings of test_check.py, at every world size, in the worlds this
    module keeps running (a world of its own per size would cost seconds)."""
    n = world_size
    if n == 1:
        pytest.skip("one rank cannot disagree with itself")
    odd_ranks = [(3 * i + 1) % n for i in range(len(MISMATCHES))]
    per_rank = worlds.get(n).run(_mismatches, MISMATCHES, odd_ranks)
    for i, ((usual, other, field), odd) in enumerate(zip(MISMATCHES, odd_ranks)):
        for rank in range(n):
            error, later = per_rank[rank][i]
            assert error is not None, f"rank {rank} missed {usual} vs {other} (odd rank {odd})"
            assert f"differ in {field}" in error, error
            assert f"rank {odd}: " in error, error
            assert later == n
