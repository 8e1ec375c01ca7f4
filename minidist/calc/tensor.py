"""Tensor-parallel cost models: shard shapes, per-layer all-reduce, overhead; 3D layout.

Megatron's layout (workbook ch. 6, worked solutions): in each block the first
linear is column-parallel (W [d_in, d_out] split as [d_in, d_out/t], no
communication) and the second row-parallel (split as [d_in/t, d_out], one
all-reduce of the [b*s, d] output). A transformer layer (attention + FFN)
therefore all-reduces its activations twice in the forward and twice in the
backward. t is the TP degree, d the hidden size, s the sequence length, b the
micro-batch.
"""
from __future__ import annotations

from minidist.calc.comm import ring_all_reduce_bytes


def _divide(total: int, parts: int, what: str) -> int:
    if parts < 1 or total % parts:
        raise ValueError(f"{what} ({total}) must divide evenly over {parts} ranks")
    return total // parts


def column_parallel_shard(in_features: int, out_features: int, tp: int) -> tuple[int, int]:
    """Shape of each rank's W in a column-parallel linear: [d_in, d_out / t].

    Workbook 6.1: [8192, 8192] with t = 8 -> [8192, 1024].
    """
    return (in_features, _divide(out_features, tp, "out_features"))


def row_parallel_shard(in_features: int, out_features: int, tp: int) -> tuple[int, int]:
    """Shape of each rank's W in a row-parallel linear: [d_in / t, d_out].

    Workbook ch. 6 ("Row-parallel linear: Split W into [d/t, d]"); the FFN's
    down-projection in the worked solutions' column-then-row layout.
    """
    return (_divide(in_features, tp, "in_features"), out_features)


def heads_per_rank(heads: int, tp: int) -> int:
    """Attention (query) heads each rank computes: h / t.

    Chapter 26 ex. 26.7(a) (32 heads, 4 GPUs); workbook 6.1 and 6.4: 64 / 8 = 8.
    """
    return _divide(heads, tp, "heads")


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """Key/value heads each rank holds under grouped-query attention.

    h_kv / t when t divides h_kv; when t > h_kv each rank holds one KV head,
    replicated on t / h_kv ranks (``kv_head_replicas``). Workbook 6.4: 8 KV
    heads, TP = 8 -> 1 per GPU.
    """
    if tp >= kv_heads:
        _divide(tp, kv_heads, "tp (more ranks than KV heads)")
        return 1
    return _divide(kv_heads, tp, "kv_heads")


def kv_head_replicas(kv_heads: int, tp: int) -> int:
    """Copies of each KV head across the TP group: t / h_kv when t > h_kv, else 1.

    Workbook 6.4: TP = 16 with 8 KV heads -> 2 copies each.
    """
    kv_heads_per_rank(kv_heads, tp)          # validates the split
    return tp // kv_heads if tp > kv_heads else 1


def attention_params(hidden: int, heads: int | None = None,
                     kv_heads: int | None = None) -> int:
    """Parameters of an attention block's projections (no biases).

    Q and output: d x d each; K and V: d x (d h_kv / h) each. Without GQA
    (kv_heads None or equal to heads) this is 4 d^2 (workbook 9.3, ch. 6's 12 d^2
    rule). Workbook 9.3 uses 4 d^2 for Llama 405B although it has 8 KV heads of
    128: with GQA it is 2 d^2 + 2 d^2/16 = 0.57B, not 1.07B; the workbook keeps
    the round number, so its 3.69B per layer is an upper bound.
    """
    if kv_heads is None or heads is None:
        return 4 * hidden * hidden
    kv_width = _divide(hidden * kv_heads, heads, "hidden * kv_heads")
    return 2 * hidden * hidden + 2 * hidden * kv_width


def ffn_params(hidden: int, ffn_hidden: int | None = None, gated: bool = False) -> int:
    """Parameters of the FFN (no biases): 2 d d_ff, or 3 d d_ff when gated (SwiGLU).

    d_ff defaults to 4d, giving 8 d^2. Workbook 9.3: 3 x 16384 x 53248 = 2.62B.
    """
    width = 4 * hidden if ffn_hidden is None else ffn_hidden
    return (3 if gated else 2) * hidden * width


def layer_params(hidden: int, ffn_hidden: int | None = None, gated: bool = False,
                 heads: int | None = None, kv_heads: int | None = None) -> int:
    """Parameters of one transformer layer: attention + FFN; 12 d^2 by default.

    Workbook 6.3: d = 8192 -> 12 d^2 = 805M; 9.3: 4d^2 + 3 d d_ff = 3.69B.
    """
    return attention_params(hidden, heads, kv_heads) + ffn_params(hidden, ffn_hidden, gated)


def tp_weight_bytes_per_gpu(params: float, tp: int, bytes_per_param: float = 2.0) -> float:
    """Weight bytes each rank holds: params x bytes / t (every matrix is split t ways).

    Workbook 6.3: 80 layers x 805M x 2 bytes = 128.8 GB -> 16.1 GB per GPU at TP = 8.
    """
    return params * bytes_per_param / tp


def tp_all_reduce_bytes(batch: int, seq_len: int, hidden: int, tp: int,
                        bytes_per_element: float = 2.0) -> float:
    """Bytes each rank sends for one TP all-reduce of the [b*s, d] activation.

    Ring: 2(t-1)/t x b s d x bytes. Workbook 6.2: b = 1, s = 4096, d = 8192,
    FP16 (64 MiB), t = 8 -> 2 x 64 x 7/8 = 112 MiB.
    """
    return ring_all_reduce_bytes(batch * seq_len * hidden * bytes_per_element, tp)


def tp_comm_bytes_per_layer(batch: int, seq_len: int, hidden: int, tp: int,
                            bytes_per_element: float = 2.0, all_reduces: int = 2,
                            passes: int = 1) -> float:
    """Bytes each rank sends per transformer layer for TP: all_reduces x passes x one.

    2 all-reduces per layer (after attention, after the FFN); passes = 1 for the
    forward only, 2 for forward and backward. Workbook 6.2: 80 layers x 2 x
    112 MiB = 17.5 GiB per GPU for the forward.
    """
    one = tp_all_reduce_bytes(batch, seq_len, hidden, tp, bytes_per_element)
    return all_reduces * passes * one


def tp_overhead(all_reduce_seconds: float, layers: int, compute_seconds: float,
                all_reduces_per_layer: int = 2, passes: int = 2) -> float:
    """TP communication time / compute time; it sits on the critical path, unoverlapped.

    layers x all_reduces_per_layer x passes x t_ar / T_compute. Workbook 6.5:
    80 x 2 x 2 x 0.09 ms = 28.8 ms over 300 ms = 9.6%.
    """
    count = layers * all_reduces_per_layer * passes
    return count * all_reduce_seconds / compute_seconds


def data_parallel_degree(world_size: int, tp: int, pp: int, cp: int = 1) -> int:
    """DP = world / (TP x PP x CP): what is left for data parallelism in a 3D mesh.

    Workbook 9.1: 16384 / (8 x 16) = 128. Worked solutions: 8 x 8 x 8 = 512 GPUs.
    """
    return _divide(world_size, tp * pp * cp, "world_size")
