"""The alpha-beta cost model (comm/collectives/cost.py) against the worked numbers."""
import pytest

from minidist.comm.collectives import cost

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_ring_all_reduce_of_2gb_on_8_gpus_at_50gbs_takes_70ms():
    # Workbook exercise 0.2: 2 * 2 GB * 7/8 / 50 GB/s = 70 ms (latency ignored).
    c = cost.ring_all_reduce(2e9, 8, 0.0, 50e9)
    assert c.seconds == pytest.approx(0.070) and c.bytes_sent == pytest.approx(3.5e9)


def test_ring_sends_the_same_per_rank_whatever_n():
    assert cost.ring_all_reduce(1e9, 1000, 0, 1).bytes_sent == pytest.approx(1.998e9)


def test_ring_latency_term_is_2_n_minus_1_alpha():
    assert cost.ring_all_reduce(0.0, 8, 5e-6, 1e9).seconds == pytest.approx(14 * 5e-6)


def test_naive_root_sends_n_minus_1_times_m():
    assert cost.naive_all_reduce(4.0, 8, 0, 1).bytes_sent == 28.0


def test_tree_beats_ring_for_tiny_messages_and_loses_for_large():
    alpha, beta = 10e-6, 10e9
    assert cost.tree_all_reduce(1e3, 8, alpha, beta).seconds < \
        cost.ring_all_reduce(1e3, 8, alpha, beta).seconds
    assert cost.tree_all_reduce(1e9, 8, alpha, beta).seconds > \
        cost.ring_all_reduce(1e9, 8, alpha, beta).seconds


def test_busbw_is_algbw_times_2_n_minus_1_over_n():
    algbw, busbw = cost.bus_bandwidth(1e9, 4, 0.5)
    assert algbw == 2e9 and busbw == pytest.approx(3e9)


def test_fit_recovers_alpha_and_beta():
    alpha, beta, n = 20e-6, 5e9, 4
    sizes = [2.0 ** k for k in range(10, 28)]
    times = [cost.ring_all_reduce(m, n, alpha, beta).seconds for m in sizes]
    a, b = cost.fit_alpha_beta(sizes, times, n)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6)


def test_allgather_all_reduce_takes_log_n_steps_and_sends_n_minus_1_times_m():
    c = cost.allgather_all_reduce(1e3, 5, 1e-6, 1e9)
    assert c.steps == 3 and c.bytes_sent == 4e3
    assert c.seconds == pytest.approx(3e-6 + 4e3 / 1e9)
    # fewer rounds than recursive doubling plus a separate check, for tiny M
    assert c.steps < cost.recursive_doubling_all_reduce(1e3, 5, 1e-6, 1e9).steps


def test_direct_all_reduce_sends_the_rings_bytes_in_3_log_n_steps():
    from minidist.comm.collectives.cost import ALL_REDUCE
    for n in (2, 3, 4, 5, 6, 8):
        direct, ring = (ALL_REDUCE[a](1e6, n, 1e-5, 1e9) for a in ("direct", "ring"))
        assert direct.bytes_sent == ring.bytes_sent
        assert direct.steps == 3 * (n - 1).bit_length()     # 3 ceil(log2 N)
        assert (direct.seconds < ring.seconds) == (n >= 6)  # 2(N-1) > 3 ceil(log2 N) from 6


def test_oneshot_all_reduce_takes_one_step_and_sends_the_allgathers_bytes():
    c = cost.oneshot_all_reduce(1e3, 5, 1e-6, 1e9)
    assert c.steps == 1 and c.bytes_sent == cost.allgather_all_reduce(1e3, 5, 1e-6, 1e9).bytes_sent
    assert c.seconds == pytest.approx(1e-6 + 4e3 / 1e9)
    assert cost.oneshot_all_reduce(1e3, 1, 1e-6, 1e9).seconds == 0
