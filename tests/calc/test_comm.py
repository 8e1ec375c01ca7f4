"""minidist.calc.comm against the worked numbers of the source documents.

"workbook X.Y" is the workbook's exercise X.Y (004_*.txt), "quiz QN" the chapter
26 quiz (002_*.txt). Each assertion compares with the number the source prints,
at the precision it rounds to.
"""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import (all_gather_bytes, all_reduce_cost, bandwidth_utilization,
                           bus_bandwidth, comm_compute_ratio, comm_overhead_fraction,
                           dp_comm_compute_ratio, exposed_comm_seconds,
                           hierarchical_all_reduce, mfu_with_exposed_comm,
                           naive_all_reduce_bytes, overlap_fraction, reduce_scatter_bytes,
                           ring_all_reduce_bytes, ring_all_reduce_time,
                           tree_all_reduce_time, tree_reduce_time)
from minidist.calc.units import GB, MS, TFLOPS, US

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_workbook_ex_0_1_ring_volume_8_gpus():
    assert ring_all_reduce_bytes(1 * GB, 8) / GB == pytest.approx(1.75)
    # "0.875 GB in the reduce-scatter phase and 0.875 GB in the allgather phase"
    assert reduce_scatter_bytes(1 * GB, 8) / GB == pytest.approx(0.875)
    assert all_gather_bytes(1 * GB, 8) / GB == pytest.approx(0.875)


def test_workbook_ex_0_1_ring_volume_1000_gpus_barely_grows():
    assert ring_all_reduce_bytes(1 * GB, 1000) / GB == pytest.approx(1.998)


def test_workbook_ex_0_2_ring_time_8_gpus():
    assert ring_all_reduce_bytes(2 * GB, 8) / GB == pytest.approx(3.5)
    assert ring_all_reduce_time(2 * GB, 8, 50 * GB) / MS == pytest.approx(70)


def test_workbook_ex_0_2_latency_term_is_14_steps_of_5_us():
    # "With 2(N-1) = 14 steps and ~5 us latency per step, that adds only 70 us"
    with_latency = ring_all_reduce_time(2 * GB, 8, 50 * GB, latency=5 * US)
    without = ring_all_reduce_time(2 * GB, 8, 50 * GB)
    assert (with_latency - without) / US == pytest.approx(70)
    assert all_reduce_cost(2 * GB, 8, 50 * GB, 5 * US).steps == 14


def test_workbook_ex_0_3_bus_bandwidth_utilization():
    assert ring_all_reduce_bytes(4 * GB, 8) / GB == pytest.approx(7)
    assert bus_bandwidth(4 * GB, 8, 30 * MS) / GB == pytest.approx(233, abs=0.5)
    assert bandwidth_utilization(4 * GB, 8, 30 * MS, 300 * GB) == pytest.approx(0.778, abs=5e-4)


def test_workbook_ex_0_4_ring_beats_tree_for_large_messages():
    assert ring_all_reduce_time(4 * GB, 8, 50 * GB) / MS == pytest.approx(140)
    assert tree_reduce_time(4 * GB, 8, 50 * GB) / MS == pytest.approx(240)
    assert tree_all_reduce_time(4 * GB, 8, 50 * GB) / MS == pytest.approx(480)
    # "The tree has fewer steps (6 vs 14)"
    assert all_reduce_cost(4 * GB, 8, 50 * GB, algorithm="tree").steps == 6
    assert all_reduce_cost(4 * GB, 8, 50 * GB, algorithm="ring").steps == 14


def test_workbook_ex_1_5_zero3_all_gather_volume():
    fp16_weights = 14 * GB                          # 7B params x 2 bytes
    per_collective = all_gather_bytes(fp16_weights, 64)
    assert per_collective / GB == pytest.approx(13.78, abs=0.005)
    per_step = 3 * per_collective                   # AG forward, AG + RS backward
    assert per_step / GB == pytest.approx(41.3, abs=0.05)
    # "At 100 GB/s, that's ~420 ms" (from the rounded 42 GB; 41.3 GB gives 413 ms)
    assert per_step / (100 * GB) / MS == pytest.approx(420, abs=10)


def test_workbook_ex_1_5_zero12_all_reduce_and_ratio():
    # "ZeRO-1/2 which only does one AllReduce of gradients (~28 GB)"
    all_reduce = ring_all_reduce_bytes(14 * GB, 64)
    assert all_reduce / GB == pytest.approx(28, abs=0.5)
    # "ZeRO-3 trades 1.5x more communication"
    assert 3 * all_gather_bytes(14 * GB, 64) / all_reduce == pytest.approx(1.5)


def test_workbook_ex_4_1_all_reduce_10b_on_64_gpus():
    grads = 10e9 * 2                                # FP16 gradients
    assert grads / GB == pytest.approx(20)
    assert ring_all_reduce_time(grads, 64, 600 * GB) / MS == pytest.approx(65.6, abs=0.05)


def test_workbook_ex_4_2_overlap_97_5_percent():
    layers, t_ar, t_bwd = 40, 1.5 * MS, 5 * MS
    assert layers * t_ar / MS == pytest.approx(60)
    assert exposed_comm_seconds(layers, t_ar, t_bwd) / MS == pytest.approx(1.5)
    assert overlap_fraction(layers, t_ar, t_bwd) == pytest.approx(0.975)
    # "less than 1% overhead" (1.5 ms on a 200 ms backward)
    assert comm_overhead_fraction(layers, t_ar, t_bwd) < 0.01


def test_overlap_backs_up_when_all_reduce_is_slower_than_a_layer():
    # each bucket 2 ms late -> the queue grows by 1 ms per layer
    assert exposed_comm_seconds(10, 3.0, 2.0) == pytest.approx(3.0 + 9 * 1.0)


def test_workbook_ex_4_3_hierarchical_cross_node_step():
    cost = hierarchical_all_reduce(20 * GB, gpus_per_node=8, nodes=8,
                                   intra_bandwidth=600 * GB, inter_bandwidth=100 * GB)
    assert cost.inter_seconds / MS == pytest.approx(350)
    # "350 ms for the cross-node step alone — 5x slower than the full NVLink AllReduce"
    flat_nvlink = ring_all_reduce_time(20 * GB, 64, 600 * GB)
    assert cost.inter_seconds / flat_nvlink == pytest.approx(5, abs=0.5)
    assert cost.seconds == pytest.approx(cost.intra_seconds + cost.inter_seconds)


def test_workbook_ex_4_4_comm_compute_ratio_and_effective_mfu():
    compute = 120e12 / (989 * TFLOPS * 0.5)         # 120 TFLOPs at 50% MFU of an H100
    assert compute / MS == pytest.approx(242, abs=1)
    assert comm_compute_ratio(350 * MS, compute) == pytest.approx(1.45, abs=0.01)
    assert mfu_with_exposed_comm(0.5, compute, 350 * MS) == pytest.approx(0.20, abs=0.005)


def test_workbook_ex_4_5_comm_compute_ratio_function_matches_its_parts():
    ratio = dp_comm_compute_ratio(10e9, 64, 600 * GB, 120e12, 495 * TFLOPS)
    expected = ring_all_reduce_time(20 * GB, 64, 600 * GB) / (120e12 / (495 * TFLOPS))
    assert ratio == pytest.approx(expected)


def test_workbook_ex_9_7_dp_all_reduce_of_a_405b_stage():
    grads = 3.69e9 * 2
    assert grads / GB == pytest.approx(7.38)
    per_gpu = ring_all_reduce_bytes(grads, 128)
    assert per_gpu / GB == pytest.approx(14.63, abs=0.02)   # printed as 14.65 and 14.63
    # "At 400 Gb/s = 50 GB/s InfiniBand, time = 14.63/50 ~ 293 ms"
    assert ring_all_reduce_time(grads, 128, 50 * GB) / MS == pytest.approx(293, abs=0.5)


def test_quiz_q1_naive_root_carries_2_n_minus_1_m():
    n, m = 8, 1.0
    # the root receives (N-1) M and sends (N-1) M: 2(N-1) M through one interface
    assert 2 * naive_all_reduce_bytes(m, n) == pytest.approx(2 * (n - 1) * m)
    assert all_reduce_cost(m, n, 1.0, algorithm="naive").bytes_per_rank == (n - 1) * m


@given(n=st.integers(1, 4096), m=st.floats(1.0, 1e12))
def test_ring_volume_is_below_2m_and_twice_an_all_gather(n, m):
    volume = ring_all_reduce_bytes(m, n)
    assert volume < 2 * m
    assert volume == pytest.approx(2 * all_gather_bytes(m, n))


@given(n=st.integers(2, 1024))
def test_ring_never_sends_more_than_naive_root(n):
    assert ring_all_reduce_bytes(1.0, n) <= naive_all_reduce_bytes(1.0, n)


def test_small_messages_favour_the_tree_large_favour_the_ring():
    n, bw, alpha = 64, 50 * GB, 10 * US
    assert tree_all_reduce_time(1e3, n, bw, alpha) < ring_all_reduce_time(1e3, n, bw, alpha)
    assert ring_all_reduce_time(1e9, n, bw, alpha) < tree_all_reduce_time(1e9, n, bw, alpha)
    assert math.isclose(all_reduce_cost(1e9, n, bw, alpha).seconds,
                        ring_all_reduce_time(1e9, n, bw, alpha))


def test_unknown_algorithm_is_an_error():
    with pytest.raises(ValueError, match="ring, tree or naive"):
        all_reduce_cost(1.0, 4, 1.0, algorithm="butterfly")


@pytest.mark.parametrize("collective,factor", [
    ("all_reduce", 2 * 7 / 8), ("all_gather", 7 / 8), ("reduce_scatter", 7 / 8),
    ("all_to_all", 7 / 8), ("broadcast", 1.0), ("reduce", 1.0)])
def test_bus_bandwidth_uses_nccl_tests_factor_for_every_collective(collective, factor):
    # 4 GB on 8 ranks in 30 ms: algbw 133.3 GB/s, times the collective's factor
    got = bus_bandwidth(4 * GB, 8, 30 * MS, collective)
    assert got == pytest.approx(4 * GB / (30 * MS) * factor)


@given(n=st.integers(1, 1024), size=st.floats(1, 1e12), t=st.floats(1e-6, 10))
def test_all_reduce_busbw_is_twice_all_gather_busbw(n, size, t):
    assert bus_bandwidth(size, n, t) == pytest.approx(2 * bus_bandwidth(size, n, t, "all_gather"))
    assert bus_bandwidth(size, n, t) == pytest.approx(ring_all_reduce_bytes(size, n) / t)


def test_bus_bandwidth_of_an_unknown_collective_is_an_error():
    with pytest.raises(ValueError, match="collective"):
        bus_bandwidth(1e6, 4, 1e-3, "gather_all")
