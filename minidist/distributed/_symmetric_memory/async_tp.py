"""Async tensor parallelism (collective matmul): a gather or a scatter fused with its matmul.

Sequence parallelism (parallel/tensor/mappings.py) all-gathers the positions before a column-parallel
matmul and reduce-scatters the partial sums after a row-parallel one, and waits for each
collective before computing. Cut the collective into its N ring steps and compute on
the chunk already here while the next one travels (Wang et al., 2023, "Overlap
communication with dependent computation via decomposition"; the scaling book's
"collective matmul"; torchtitan's async TP, torch's ``torch.ops.symm_mem`` ops of the
same names; Megatron's ``--tp-comm-overlap``):

    fused_all_gather_matmul, rank r, steps s = 0 .. N-1, chunk c = (r - s) mod N:
        post  send A_c to r+1, receive A_{c-1} from r-1       (but at the last step)
        Y_c = A_c @ B                                         (while it travels)
        wait
    -> A = [A_0; ...; A_{N-1}] along gather_dim,  Y = [Y_0; ...; Y_{N-1}] = A @ B

    fused_matmul_reduce_scatter, rank r, steps s = 0 .. N-1, chunk c = (r + s + 1) mod N:
        P_c = chunk c of A (along scatter_dim) @ B            (this rank's summand)
        post  send the running sum of chunk c-1 to r-1, receive that of c from r+1
        S_c = (received) + P_c                                (at s = 0: S_c = P_c)
    -> at s = N-1, c = r: S_r = sum over ranks of chunk r of A @ B

Every step moves 1/N of the bytes of the plain collective, so the wire time
(N-1)/N * M/B hides behind N-1 of the N chunk matmuls. Each is the other's backward:

    Y = AG(A) @ B           dA = RS(dY @ B^T)      dB = AG(A)^T dY
    Z = RS(A @ B)           dA = AG(dZ) @ B^T      dB = A^T AG(dZ)

Gathering along A's last axis (the contraction) turns the row blocks into a sum,
Y = sum_c A_c @ B_c (B_c: B's rows of chunk c), added in rank order so that every rank
gets the same bits; scattering along the output's last axis cuts B's columns.

What equals what: the gathered A is the plain all-gather's, bit for bit. The products
equal the plain matmul to a float tolerance, not bit for bit: a row block's product is
the same sum as the whole matrix's row, but BLAS picks its kernel by the block's height,
and one for an odd height rounds differently (float64 differences of ~1e-15). A
reduce-scatter's sum runs in ring order: a reordered sum.
The rings themselves, on arrays, one direction and both (``bidirectional=True``: each
chunk sent both ways round, floor(N/2) steps instead of N-1), are ring_matmul.py.
Tests: tests/parallel/tensor/test_async_tp.py.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.distributed._symmetric_memory.ring_matmul import (
    axis, ring_all_gather_matmul, ring_matmul_reduce_scatter)


class FusedAllGatherMatmul(Function):
    """(A, *Bs) -> (AG(A), AG(A) @ B_1, ...); backward: one fused matmul-reduce-scatter."""

    @staticmethod
    def forward(ctx, a_shard, *bs, gather_dim=0, group=None, bidirectional=False):
        a_full, outs = ring_all_gather_matmul(a_shard, list(bs), gather_dim, group,
                                              bidirectional)
        ctx.save_for_backward(a_full, *bs)
        ctx.dim, ctx.group = axis(gather_dim, a_shard.ndim, "gather_dim"), group
        ctx.bidirectional = bidirectional
        return (a_full, *outs)

    @staticmethod
    def backward(ctx, d_full, *d_outs):
        a_full, *bs = ctx.saved
        d_cat = xp.concatenate(list(d_outs), axis=-1)                # (..., sum of N_i)
        b_t = xp.concatenate([b.T for b in bs], axis=0)             # (sum of N_i, K)
        da = ring_matmul_reduce_scatter(d_cat, b_t, ctx.dim, ctx.group, plus=d_full,
                                        bidirectional=ctx.bidirectional)
        a2 = a_full.reshape(-1, a_full.shape[-1])                    # (M, K)
        dbs = [xp.matmul(a2.T, d.reshape(-1, d.shape[-1])) for d in d_outs]   # (K, N_i)
        return (da, *dbs)


class FusedMatmulReduceScatter(Function):
    """(A, B) -> RS(A @ B) ("sum" or "avg"); backward: one fused all-gather-matmul."""

    @staticmethod
    def forward(ctx, a, b, reduce_op="sum", scatter_dim=0, group=None, bidirectional=False):
        if reduce_op not in ("sum", "avg"):
            raise ValueError(f"fused_matmul_reduce_scatter: reduce_op must be 'sum' or "
                             f"'avg', got {reduce_op!r}")
        out = ring_matmul_reduce_scatter(a, b, scatter_dim, group, bidirectional=bidirectional)
        ctx.scale = 1.0 / dist.get_world_size(group) if reduce_op == "avg" else None
        ctx.dim, ctx.group = axis(scatter_dim, a.ndim, "scatter_dim"), group
        ctx.bidirectional = bidirectional
        ctx.save_for_backward(a, b)
        return out if ctx.scale is None else out * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved
        grad = grad if ctx.scale is None else grad * ctx.scale
        g_full, (da,) = ring_all_gather_matmul(grad, [b.T], ctx.dim, ctx.group,
                                               ctx.bidirectional)
        a2 = a.reshape(-1, a.shape[-1])                               # (M, K)
        db = xp.matmul(a2.T, g_full.reshape(-1, g_full.shape[-1]))    # (K, N)
        return da, db, None, None, None, None


def fused_all_gather_matmul(a_shard: Tensor, bs: list, gather_dim: int, group: Any = None,
                            bidirectional: bool = False) -> tuple[Tensor, list[Tensor]]:
    """``(a, [a @ b for b in bs])`` with ``a`` the all-gather of ``a_shard`` along
    ``gather_dim`` over ``group``, the gather overlapped with the products (torch's
    ``torch.ops.symm_mem.fused_all_gather_matmul``); differentiable. ``bidirectional``:
    each chunk sent both ways round the ring (ring_matmul.py)."""
    if not bs:
        raise ValueError("fused_all_gather_matmul needs at least one B")
    a_full, *outs = FusedAllGatherMatmul.apply(a_shard, *bs, gather_dim=gather_dim,
                                               group=group, bidirectional=bidirectional)
    return a_full, outs


def fused_matmul_reduce_scatter(a: Tensor, b: Tensor, reduce_op: str = "sum",
                                scatter_dim: int = 0, group: Any = None,
                                bidirectional: bool = False) -> Tensor:
    """The reduce-scatter (``reduce_op`` "sum" or "avg") of ``a @ b`` along
    ``scatter_dim`` over ``group``, the products overlapped with the transfers (torch's
    ``torch.ops.symm_mem.fused_matmul_reduce_scatter``); differentiable.
    ``bidirectional``: the running sums travel both ways round (ring_matmul.py)."""
    return FusedMatmulReduceScatter.apply(a, b, reduce_op, scatter_dim, group, bidirectional)
