"""Sharded Muon's cost model: the worked number, and the ratios of the two schemes."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import gpt_block_matrices, muon_step_costs, newton_schulz_flops

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_gpt2_small_worked_number():
    gather, robin = muon_step_costs(gpt_block_matrices(768, 12), 8)
    assert round(gather.bytes_per_rank / 1e6) == 297 and round(robin.bytes_per_rank / 1e6) == 74
    assert round(gather.flops_in_world / 1e12, 1) == 12.2
    assert round(robin.flops_in_world / 1e12, 2) == 1.52


def test_newton_schulz_flops_do_not_depend_on_orientation():
    # the iteration transposes a tall matrix: (A, B) and (B, A) cost the same
    assert newton_schulz_flops(3072, 768) == newton_schulz_flops(768, 3072) \
        == 5 * (4 * 768 ** 2 * 3072 + 2 * 768 ** 3)


@given(n=st.integers(1, 16), hidden=st.sampled_from([8, 64, 96]), layers=st.integers(1, 4))
def test_round_robin_does_one_nth_of_the_flops_and_two_nths_of_the_bytes(n, hidden, layers):
    shapes = [(a * n, b) for a, b in gpt_block_matrices(hidden, layers)]   # rows divide by N
    gather, robin = muon_step_costs(shapes, n)
    assert robin.flops_in_world * n == gather.flops_in_world
    assert gather.iterations_in_world == n * robin.iterations_in_world == n * len(shapes)
    assert abs(robin.bytes_per_rank * n - 2 * gather.bytes_per_rank) <= 1e-6 * gather.bytes_per_rank
