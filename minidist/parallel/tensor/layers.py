"""Tensor parallelism (Megatron-LM): each weight matrix split across the t ranks of a group.

A linear layer computes Y = X A^T with A of shape (out, in), as nn.Linear. Split A
two ways (notation of the workbook, ch. 6, with A^T = [A_1 ... A_t]):

    column parallel   A split by output rows:  Y_i = X A_i^T          (B, T, out/t)
                      X must be on every rank: Megatron's f before it
                      (identity forward, all-reduce of dL/dX backward)
    row parallel      A split by input columns, X already split:
                      Y = sum_i X_i A_i^T       (B, T, out)
                      the sum is Megatron's g (all-reduce forward, identity backward)

Column then row (the MLP's c_fc then c_proj; attention's q, k, v then c_proj):
the column layer's output slice is exactly the row layer's input slice, so the
pair needs one all-reduce forward (g) and one backward (f): worked solutions,
"Megatron column-then-row"; workbook 6.2 for the bytes it moves.

Attention splits by heads: rank r holds heads [r nh/t, (r+1) nh/t), i.e. the
matching rows of each of W_q, W_k, W_v inside c_attn (whose outputs are
[q | k | v], each C wide), and the matching input columns of c_proj.

Sequence parallelism (``sequence_parallel=True``): the input of a column layer is
the rank's T/t positions and is all-gathered (not copied), the output of a row
layer is reduce-scattered (not all-reduced); see mappings.py. With ``async_tp=True``
too, each of those collectives is fused with its matmul as a ring that computes on one
chunk while the next travels (distributed/_symmetric_memory/async_tp.py:
``fused_all_gather_matmul``, ``fused_matmul_reduce_scatter``). Parameters used on
position shards (layer norms, the row layer's bias) then see only T/t positions
each, so their gradient is summed over the group: they go through f too.

Every layer starts from the dense layer the same seed would draw (each rank draws
the whole matrix and keeps its shard: simple, and the TP model then equals the
single-process one; a real run draws only its shard). ``shard(name, full)``
gives a layer's shard of a dense parameter, so ``shard_state_dict`` can slice a
dense model's weights or gradients into any TP model. Demo: demos/06_tensor_parallel.py.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.attention import flash_attention, naive_attention
from minidist.autograd.functional import split
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.distributed.tensor._piece_norm import note_piece_over
from minidist.nn import functional as F
from minidist.nn.layers import Dropout, LayerNorm, Linear
from minidist.nn.module import Module, Parameter, persistent_buffers
from minidist.precision.autocast import get_autocast_policy
from minidist.distributed._symmetric_memory import (fused_all_gather_matmul,
                                                    fused_matmul_reduce_scatter)
from minidist.parallel.tensor.mappings import (copy_to_tp, gather_from_sp, gather_from_tp,
                                       reduce_from_tp, reduce_scatter_to_sp)


def _divide(n: int, t: int, what: str) -> int:
    if n % t:
        raise ValueError(f"{what}={n} is not divisible by the tensor-parallel size {t}")
    return n // t


def _owned(start: int, stop: int) -> Any:
    return xp.arange(start, stop)


def check_async_tp(async_tp: bool, sequence_parallel: bool) -> None:
    """Async TP fuses sequence parallelism's all-gather and reduce-scatter with the
    matmuls: refuse it without them (torchtitan requires sequence parallelism too)."""
    if async_tp and not sequence_parallel:
        raise ValueError("async_tp overlaps sequence parallelism's all-gather and "
                         "reduce-scatter with the matmuls: turn sequence_parallel on too")


def _overlapping(layer: Module) -> bool:
    """Take the fused ring (distributed/_symmetric_memory/)? Under autocast the products are rounded by
    F.linear's low-precision path, which the ring does not take: refuse, not skip."""
    if not layer.async_tp:
        return False
    if get_autocast_policy() is not None:
        raise ValueError("async_tp multiplies in the parameters' dtype; under autocast "
                         "build the layers with async_tp=False")
    return True


class ColumnParallelLinear(Module):
    """Y_i = X A_i^T + b_i: this rank's out/t output features (of A: (out, in)).

    ``gather_output``: all-gather the slices so every rank has Y (B, T, out).
    ``rows``: which output rows of the dense A this rank owns (default the r-th
    contiguous block; attention passes its heads' rows of q, k and v).
    """

    sharded = ("weight", "bias")    # parameters split over the group (the rest: replicated)

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, sequence_parallel: bool = False,
                 group: Any = None, dtype: str = "float32", std: float | None = None,
                 generator: Any = None, rows: Any = None, async_tp: bool = False):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        per_rank = _divide(out_features, t, "out_features")
        check_async_tp(async_tp, sequence_parallel)
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.async_tp = async_tp
        self.rows = _owned(r * per_rank, (r + 1) * per_rank) if rows is None else rows
        dense = Linear(in_features, out_features, bias, dtype, std, generator)
        self.weight = Parameter(self.shard("weight", dense.weight.data))   # (out/t, in)
        self.bias = Parameter(self.shard("bias", dense.bias.data)) if bias else None
        note_tp_pieces(self, group)

    def shard(self, name: str, full: Any) -> Any:
        """This rank's rows of the dense weight (out, in) or bias (out,)."""
        return full[self.rows].copy()

    def forward(self, x: Tensor) -> Tensor:
        if _overlapping(self):   # the gather of positions fused with the matmul, as a ring
            _, (y,) = fused_all_gather_matmul(x, [self.weight.T], 1, self.group)  # (B, T, out/t)
            y = y if self.bias is None else y + self.bias
            return gather_from_tp(y, axis=-1, group=self.group) if self.gather_output else y
        if self.sequence_parallel:
            x = gather_from_sp(x, axis=1, group=self.group)           # (B, T/t, in) -> (B, T, in)
        else:
            x = copy_to_tp(x, self.group)                              # f
        y = F.linear(x, self.weight, self.bias)                        # (B, T, out/t)
        if self.gather_output:
            y = gather_from_tp(y, axis=-1, group=self.group)           # (B, T, out)
        return y


class RowParallelLinear(Module):
    """Y = sum_i X_i A_i^T + b: input already split (B, T, in/t), output summed (g)."""

    sharded = ("weight",)           # the bias is added after the sum: the same on every rank

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 sequence_parallel: bool = False, group: Any = None, dtype: str = "float32",
                 std: float | None = None, generator: Any = None, async_tp: bool = False):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        per_rank = _divide(in_features, t, "in_features")
        check_async_tp(async_tp, sequence_parallel)
        self.group, self.sequence_parallel, self.async_tp = group, sequence_parallel, async_tp
        self.cols = _owned(r * per_rank, (r + 1) * per_rank)
        dense = Linear(in_features, out_features, bias, dtype, std, generator)
        self.weight = Parameter(self.shard("weight", dense.weight.data))   # (out, in/t)
        self.bias = Parameter(dense.bias.data.copy()) if bias else None   # (out,), replicated
        note_tp_pieces(self, group, ("weight",))

    def shard(self, name: str, full: Any) -> Any:
        if name == "weight":
            return full[:, self.cols].copy()
        return full.copy()

    def forward(self, x: Tensor) -> Tensor:
        if _overlapping(self):   # the matmul fused with the reduce-scatter, as a ring
            y = fused_matmul_reduce_scatter(x, self.weight.T, "sum", 1, self.group)  # (B, T/t, out)
            return y if self.bias is None else y + copy_to_tp(self.bias, self.group)
        partial = F.linear(x, self.weight)                             # (B, T, out), X_i A_i^T
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(partial, axis=1, group=self.group)  # (B, T/t, out)
            bias = None if self.bias is None else copy_to_tp(self.bias, self.group)
        else:
            y = reduce_from_tp(partial, self.group)                    # g: (B, T, out)
            bias = self.bias
        # the bias is added once, after the sum (added before, it would count t times)
        return y if bias is None else y + bias


class SequenceParallelLayerNorm(LayerNorm):
    """LayerNorm on this rank's positions; its weight and bias go through f, so
    their gradients (partial: T/t positions each) are summed over the group."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True,
                 dtype: str = "float32", group: Any = None):
        super().__init__(dim, eps, bias, dtype)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else copy_to_tp(self.bias, self.group)
        return F.layer_norm(x, copy_to_tp(self.weight, self.group), bias, self.eps)


class ParallelMLP(Module):
    """c_fc column-parallel (C -> 4C/t), GELU, c_proj row-parallel (4C/t -> C).

    One all-reduce forward (in c_proj) and one backward (in c_fc's f).
    """

    def __init__(self, n_embd: int, hidden: int | None = None, dropout: float = 0.0,
                 bias: bool = True, dtype: str = "float32", std: float | None = None,
                 proj_std: float | None = None, generator: Any = None, group: Any = None,
                 sequence_parallel: bool = False, async_tp: bool = False):
        super().__init__()
        hidden = hidden or 4 * n_embd
        self.c_fc = ColumnParallelLinear(n_embd, hidden, bias, False, sequence_parallel,
                                         group, dtype, std, generator, async_tp=async_tp)
        self.c_proj = RowParallelLinear(hidden, n_embd, bias, sequence_parallel, group, dtype,
                                        proj_std or std, generator, async_tp=async_tp)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.c_fc(x))                                       # (B, T, 4C/t)
        return self.dropout(self.c_proj(h))                            # (B, T, C) or (B, T/t, C)


class ParallelSelfAttention(Module):
    """Causal self-attention with the heads split across the group: nh/t heads per rank.

    Names follow nn.CausalSelfAttention (c_attn, c_proj), so the dense weights
    shard into it: c_attn keeps rows [q_r | k_r | v_r] of the dense (3C, C) matrix.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 dtype: str = "float32", std: float | None = None,
                 proj_std: float | None = None, generator: Any = None,
                 attention: str = "naive", group: Any = None, sequence_parallel: bool = False,
                 async_tp: bool = False):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        if n_head % t:
            raise ValueError(f"n_head={n_head} is not divisible by the tensor-parallel size "
                             f"{t}: heads are split whole across the ranks")
        self.n_head, self.local_heads = n_head, n_head // t
        self.attention, self.dropout_p = attention, dropout
        width = n_embd // t                                            # this rank's q (or k, v) width
        mine = xp.arange(r * width, (r + 1) * width)
        rows = xp.concatenate([mine, n_embd + mine, 2 * n_embd + mine])   # q_r, k_r, v_r
        self.c_attn = ColumnParallelLinear(n_embd, 3 * n_embd, bias, False, sequence_parallel,
                                           group, dtype, std, generator, rows=rows,
                                           async_tp=async_tp)
        self.c_proj = RowParallelLinear(n_embd, n_embd, bias, sequence_parallel, group, dtype,
                                        proj_std or std, generator, async_tp=async_tp)
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.c_attn(x)                                           # (B, T, 3C/t)
        B, T, three_w = qkv.shape
        w = three_w // 3
        nh, hs = self.local_heads, w // self.local_heads
        q, k, v = split(qkv, w, axis=2)                                # 3 x (B, T, C/t)
        q = q.reshape(B, T, nh, hs).transpose(1, 2)                    # (B, nh/t, T, hs)
        k = k.reshape(B, T, nh, hs).transpose(1, 2)
        v = v.reshape(B, T, nh, hs).transpose(1, 2)
        p = self.dropout_p if self.training else 0.0
        if self.attention == "flash":
            y = flash_attention(q, k, v, dropout_p=p, is_causal=True)
        elif get_autocast_policy() is None:
            y = naive_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh/t, T, hs)
        else:  # op by op, so autocast rounds each product, as nn.CausalSelfAttention does
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        y = y.transpose(1, 2).reshape(B, T, w)                         # this rank's heads
        return self.resid_dropout(self.c_proj(y))                      # (B, T, C) or (B, T/t, C)


# -- dense weights <-> shards ---------------------------------------------------------

def note_tp_pieces(module: Module, group: Any, names: tuple = ("weight", "bias")) -> None:
    """Register the cut parameters ``names`` of ``module`` as pieces over the tensor-parallel
    ``group`` (autograd/pieces.py), so that ``optim.clip_grad_norm_(model.parameters())``
    and ``GradScaler`` count every rank's piece, as ``parallel.clip_grad_norm_`` does."""
    for name in names:
        param = getattr(module, name, None)
        if param is not None:
            note_piece_over(param, [group], ("tp", id(group)))


def shard_state_dict(model: Module, dense: dict) -> dict:
    """Slice a dense model's arrays (``name -> array``: weights, or gradients)
    into ``model``'s shards, by parameter name. Layers with a ``shard`` method
    slice; the rest (layer norms, position embeddings) are replicated, as are the
    persistent buffers ``dense`` holds (a router's ``expert_bias``)."""
    modules = dict(model.named_modules())
    out = {}
    for name, _ in model.named_parameters():
        owner, _, local = name.rpartition(".")
        module = modules[owner]
        full = dense[name]
        out[name] = module.shard(local, full) if hasattr(module, "shard") else full.copy()
    for name in persistent_buffers(model):
        if name in dense:
            out[name] = dense[name].copy()
    return out


def sharded_parameters(model: Module) -> list[Parameter]:
    """The parameters of ``model`` split over the tensor-parallel group (each rank a
    different slice), as named by their layer's ``sharded``; every other parameter
    (layer norms, position embeddings, row-parallel biases) is the same on all ranks.
    A global gradient norm counts a slice on every rank, a replicated one once."""
    found = {}
    for _, module in model.named_modules():
        for local in getattr(module, "sharded", ()):
            param = getattr(module, local)
            if param is not None:
                found[id(param)] = param
    return list(found.values())
