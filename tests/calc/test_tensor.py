"""minidist.calc.tensor against the worked numbers of the source documents.

"workbook X.Y" is the workbook's exercise X.Y (004_*.txt), "solutions" the
chapter 18 worked solutions (003_*.txt).
"""
import pytest

from minidist.calc import (all_gather_bytes, attention_params, column_parallel_shard,
                           data_parallel_degree, ffn_params, heads_per_rank,
                           kv_head_replicas, kv_heads_per_rank, layer_params,
                           row_parallel_shard, tp_all_reduce_bytes, tp_comm_bytes_per_layer,
                           tp_overhead, tp_weight_bytes_per_gpu)
from minidist.calc.units import GB, GiB, MiB, MS

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_workbook_ex_6_1_column_parallel_shard_shape():
    shard = column_parallel_shard(8192, 8192, tp=8)
    assert shard == (8192, 1024)
    assert shard[0] * shard[1] / 1e6 == pytest.approx(8.39, abs=0.005)
    assert 8192 * 8192 / 1e6 == pytest.approx(67.1, abs=0.05)
    # "with 64 heads and TP=8, each GPU handles 8 heads"
    assert heads_per_rank(64, 8) == 8


def test_row_parallel_splits_the_input_features():
    assert row_parallel_shard(8192, 8192, tp=8) == (1024, 8192)
    with pytest.raises(ValueError, match="divide"):
        column_parallel_shard(8192, 1000, tp=3)


def test_workbook_ex_6_2_tp_all_reduce_volume_per_layer():
    activation = 4096 * 8192 * 2                     # [b*s, d] in FP16
    assert activation / MiB == pytest.approx(64)     # the workbook's "64 MB" is MiB
    one = tp_all_reduce_bytes(1, 4096, 8192, tp=8)
    assert one / MiB == pytest.approx(112)
    # The workbook then halves it: "Per AllReduce per GPU = 112/2 = 56 MB". 112 MiB
    # is already the ring's 2(N-1)/N x M for ONE all-reduce (its own ex. 0.1
    # formula); 56 MiB is one phase of it, the reduce-scatter (or all-gather).
    assert all_gather_bytes(activation, 8) / MiB == pytest.approx(56)
    # So the forward's 2 x 80 = 160 all-reduces send 160 x 112 MiB = 17.5 GiB per
    # GPU, not the workbook's 160 x 56 MB = 8960 MB ~ 8.75 GB.
    forward = 80 * tp_comm_bytes_per_layer(1, 4096, 8192, tp=8)
    assert forward / GiB == pytest.approx(17.5)


def test_workbook_ex_6_3_70b_weights_per_gpu_at_tp_8():
    per_layer = layer_params(8192)                   # the 12 d^2 rule
    assert per_layer / 1e6 == pytest.approx(805, abs=0.5)
    assert per_layer * 2 / GB == pytest.approx(1.61, abs=0.005)
    assert 80 * 1.61 == pytest.approx(128.8)         # the workbook sums the rounded 1.61 GB
    per_gpu = tp_weight_bytes_per_gpu(80 * per_layer, tp=8)
    assert per_gpu / GB == pytest.approx(16.1, abs=0.05)


def test_workbook_ex_6_4_gqa_heads_per_gpu():
    assert heads_per_rank(64, 8) == 8
    assert kv_heads_per_rank(8, 8) == 1
    # "If TP were 16, you'd need to replicate KV heads (16/8 = 2 copies each)"
    assert kv_heads_per_rank(8, 16) == 1
    assert kv_head_replicas(8, 16) == 2


def test_workbook_ex_6_5_tp_overhead_with_nvlink():
    assert 80 * 2 * 2 == 320                         # all-reduces per step
    assert 320 * 0.09 * MS / MS == pytest.approx(28.8)
    assert tp_overhead(0.09 * MS, layers=80, compute_seconds=300 * MS) == pytest.approx(0.096)
    # "TP=16 across nodes ... each AllReduce 6x slower, pushing overhead to ~58%"
    assert tp_overhead(6 * 0.09 * MS, 80, 300 * MS) == pytest.approx(0.58, abs=0.005)
    # (6.5 takes its 0.09 ms from 6.2's halved 56 MB; the 112 MiB of one ring
    # all-reduce at 600 GB/s take 0.196 ms, and the overhead is about 21%.)


def test_workbook_ex_9_3_llama_405b_layer_params_and_tp_shard():
    d, d_ff = 16384, 53248
    assert attention_params(d) / 1e9 == pytest.approx(1.07, abs=0.005)
    assert ffn_params(d, d_ff, gated=True) / 1e9 == pytest.approx(2.62, abs=0.005)
    per_layer = layer_params(d, d_ff, gated=True)
    assert per_layer / 1e9 == pytest.approx(3.69, abs=0.005)
    # "Params per GPU = 8 layers x 3.69B / 8 (TP) = 3.69B"; FP16 -> 7.38 GB
    per_gpu_bytes = tp_weight_bytes_per_gpu(8 * per_layer, tp=8)
    assert per_gpu_bytes / 2 / 1e9 == pytest.approx(3.69, abs=0.005)
    assert per_gpu_bytes / GB == pytest.approx(7.38, abs=0.01)


def test_gqa_attention_is_smaller_than_the_workbooks_4_d_squared():
    # Llama 3.1 405B: 128 query heads, 8 KV heads -> K, V are d x 1024 each
    d = 16384
    gqa = attention_params(d, heads=128, kv_heads=8)
    assert gqa == 2 * d * d + 2 * d * 1024
    assert gqa / 1e9 == pytest.approx(0.57, abs=0.005)
    assert attention_params(d, heads=128, kv_heads=128) == 4 * d * d


def test_workbook_ex_9_1_data_parallel_degree():
    assert data_parallel_degree(16384, tp=8, pp=16) == 128


def test_solutions_3d_layout_8_by_8_by_8_is_512_gpus():
    assert data_parallel_degree(512, tp=8, pp=8) == 8


def test_mesh_that_does_not_divide_is_an_error():
    with pytest.raises(ValueError, match="divide"):
        data_parallel_degree(1000, tp=8, pp=16)
