"""Hierarchical all-reduce on a two-level world (2 nodes x 2 ranks).

Same bits on every rank; the exact sum for integers and the flat ring's sum up
to rounding for floats; 2(K-1)/K * M/L bytes per rank between nodes.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World
from minidist.comm.errors import RankFailedError


@pytest.fixture(scope="module")
def world():
    w = World(4, timeout=20.0, run_timeout=90.0, node_size=2)
    yield w
    w.close()


def reduce_on_rank(seed, count, dtype, op_name, algorithm):
    from minidist import backend
    import minidist.distributed as dist
    rng = np.random.default_rng([seed, dist.get_rank()])
    x = rng.integers(-1000, 1000, count) if dtype == "int64" else rng.standard_normal(count)
    arr = backend.from_host(x.astype(dtype))
    stats = dist.get_stats()
    before = stats.inter_node_bytes
    dist.all_reduce(arr, op=getattr(dist.ReduceOp, op_name), algorithm=algorithm)
    return backend.to_host(arr).copy(), stats.inter_node_bytes - before


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), count=st.integers(1, 3000),
       dtype=st.sampled_from(["int64", "float64", "float32"]),
       op=st.sampled_from(["SUM", "AVG", "MAX"]))
def test_hierarchical_equals_the_flat_sum_with_the_same_bits_everywhere(world, seed, count,
                                                                        dtype, op):
    if op == "AVG" and dtype == "int64":
        op = "SUM"
    hier = world.run(reduce_on_rank, seed, count, dtype, op, "hierarchical")
    flat = world.run(reduce_on_rank, seed, count, dtype, op, "ring")
    for got, _ in hier:
        np.testing.assert_array_equal(got, hier[0][0])
    if dtype == "int64" or op == "MAX":
        np.testing.assert_array_equal(hier[0][0], flat[0][0])
    else:
        tol = 1e-12 if dtype == "float64" else 1e-5
        np.testing.assert_allclose(hier[0][0], flat[0][0], rtol=tol, atol=tol)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), quarter=st.integers(1, 2000))
def test_bytes_between_nodes_are_2_k_minus_1_over_k_times_m_over_l(world, seed, quarter):
    count = 4 * quarter                       # divisible by L * K = 4: the formula is exact
    n_nodes, local = 2, 2
    m = count * 8                             # float64 bytes
    for _, inter in world.run(reduce_on_rank, seed, count, "float64", "SUM", "hierarchical"):
        assert inter == 2 * (n_nodes - 1) / n_nodes * m / local


def test_hierarchical_without_a_topology_names_the_setting():
    with World(2, timeout=10.0, run_timeout=60.0) as w:
        with pytest.raises(RankFailedError, match="node_size"):
            w.run(reduce_on_rank, 0, 8, "float64", "SUM", "hierarchical")


def test_world_rejects_a_node_size_that_does_not_divide_it():
    with pytest.raises(ValueError, match="node_size must divide"):
        World(3, node_size=2)


def test_two_level_link_is_slow_only_between_nodes():
    from minidist.comm.transport.link import EmulatedLink
    link = EmulatedLink(10_000_000_000, world_size=4, rank=1, node_size=2,
                        inter_bytes_per_s=1_000_000_000)
    assert link.ns_per_byte == [0.1, 0.1, 1.0, 1.0]
