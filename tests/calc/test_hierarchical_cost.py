"""The hierarchical all-reduce's cost: its parts are the ring's formulas."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import comm

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


@given(m=st.floats(1e3, 1e10), nodes=st.integers(1, 16), local=st.integers(1, 16),
       intra=st.floats(1e9, 1e12), inter=st.floats(1e8, 1e11), alpha=st.floats(0, 1e-4))
def test_hierarchical_is_an_intra_ring_plus_an_inter_ring_on_m_over_l(m, nodes, local, intra,
                                                                      inter, alpha):
    t = comm.hierarchical_all_reduce_time(m, nodes, local, intra, inter, alpha)
    # reduce-scatter + all-gather inside the node move what a ring of L moves
    inside = comm.ring_all_reduce_time(m, local, intra, alpha)
    between = comm.ring_all_reduce_time(m / local, nodes, inter, alpha)
    assert abs(t - (inside + between)) <= 1e-9 * max(t, 1e-12)
    b = comm.hierarchical_inter_node_bytes(m, nodes, local)
    assert abs(b - comm.ring_all_reduce_bytes(m / local, nodes)) <= 1e-12 * m


def test_one_node_costs_the_intra_node_ring():
    assert comm.hierarchical_all_reduce_time(1e8, 1, 8, 5e10, 1e9) == \
        comm.ring_all_reduce_time(1e8, 8, 5e10)
