"""Async tensor parallelism (collective matmul): a gather or a scatter fused with its matmul.

Sequence parallelism (mappings.py) all-gathers the positions before a column-parallel
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
Tests: tests/parallel/tensor/test_async_tp.py.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.autograd.function import Function
from minidist.comm.collectives.check import describe, verify_same_call
from minidist.comm.errors import CollectiveMismatchError
from minidist.comm.group import resolve
from minidist.autograd.tensor import Tensor
from minidist.backend import xp

RING_TAG = 703          # the tag of the chunks travelling round the ring


def _ring(group: Any) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of the next rank, of the previous one)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    ranks = list(range(size)) if group is None else group.ranks
    return rank, size, ranks[(rank + 1) % size], ranks[(rank - 1) % size]


def _axis(dim: int, ndim: int, what: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}={dim} is not an axis of a {ndim}-d tensor")
    return dim % ndim


def _chunks(length: int, n: int, dim: int, what: str) -> int:
    """The length of each of n equal chunks, or a clear refusal."""
    if length % n:
        raise ValueError(f"{what}: axis {dim} of length {length} does not split into {n} "
                         f"equal chunks, one per rank of the ring; pad it to a multiple of {n}")
    return length // n


def _matmul(a: Any, b: Any) -> Any:
    """(..., K) @ (K, N) -> (..., N), the leading axes folded into one (as nn.Linear)."""
    out = xp.matmul(a.reshape(-1, a.shape[-1]), b)                    # (M, N)
    return out.reshape(*a.shape[:-1], b.shape[-1])


def _take(x: Any, axis: int, index: int, length: int) -> Any:
    """Chunk ``index`` (of ``length`` along ``axis``) of ``x``, contiguous."""
    where = [slice(None)] * x.ndim
    where[axis] = slice(index * length, (index + 1) * length)
    return xp.ascontiguousarray(x[tuple(where)])


def ring_all_gather_matmul(a_shard: Any, bs: list, gather_dim: int,
                           group: Any = None) -> tuple[Any, list]:
    """Arrays: (AG(a_shard) along gather_dim, [AG(a_shard) @ b for b in bs]), as a ring."""
    rank, n, nxt, prev = _ring(group)
    dim = _axis(gather_dim, a_shard.ndim, "gather_dim")
    contract = dim == a_shard.ndim - 1           # gathering K: the products are summands
    k = a_shard.shape[-1]
    for b in bs:
        if b.shape[0] != (n * k if contract else k):
            raise ValueError(f"fused_all_gather_matmul: B of shape {tuple(b.shape)} does not "
                             f"multiply the gathered A (last axis {n * k if contract else k})")
    _same_call(group, "fused_all_gather_matmul", a_shard.shape, a_shard.dtype, dim=dim,
               bs=[tuple(b.shape) for b in bs])
    chunks, products = [None] * n, [[None] * n for _ in bs]
    chunks[rank] = xp.ascontiguousarray(a_shard)
    for step in range(n):
        c = (rank - step) % n
        pending, incoming = [], None
        if step < n - 1:                                    # the next chunk, while we compute
            incoming = xp.empty_like(chunks[c])
            pending = [dist.isend(chunks[c], nxt, group, RING_TAG),
                       dist.irecv(incoming, prev, group, RING_TAG)]
        for i, b in enumerate(bs):
            rows = b[c * k:(c + 1) * k] if contract else b
            products[i][c] = _matmul(chunks[c], rows)      # (..., shard, ..., N)
        for handle in pending:
            handle.wait()
        if incoming is not None:
            chunks[(c - 1) % n] = incoming
    a_full = xp.concatenate(chunks, axis=dim)
    if contract:                                 # sum in rank order: the same on every rank
        outs = [_sum_in_order(p) for p in products]
    else:
        outs = [xp.concatenate(p, axis=dim) for p in products]
    return a_full, outs


def _same_call(group: Any, name: str, shape: tuple, dtype: Any, **fields: Any) -> None:
    """Check, before any chunk moves, that every rank called ``name`` on a shard of the same
    shape (the same-call check of every collective, comm/collectives/check.py): a rank
    with a shorter sequence is refused on every rank, not left to mismatch mid-ring."""
    g = resolve(group)
    if not (g.check and g.size > 1):
        return
    line = describe(name, shape=tuple(shape), dtype=xp.dtype(dtype).name, **fields)
    try:
        verify_same_call(g, line, g.next_collective_tag())
    except CollectiveMismatchError as e:
        raise ValueError(f"{name}: the ranks' calls differ ({e}); every rank must hold an "
                         f"equal shard: pad the sequence to a multiple of the group "
                         f"size {g.size}") from e


def _sum_in_order(parts: list) -> Any:
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


def ring_matmul_reduce_scatter(a: Any, b: Any, scatter_dim: int, group: Any = None,
                               plus: Any = None) -> Any:
    """Array: the sum over ranks of chunk r of ``a @ b (+ plus)`` along scatter_dim, as a ring."""
    rank, n, nxt, prev = _ring(group)
    dim = _axis(scatter_dim, a.ndim, "scatter_dim")
    columns = dim == a.ndim - 1                  # scattering N: cut B's columns
    length = b.shape[1] if columns else a.shape[dim]
    size = _chunks(length, n, dim, "fused_matmul_reduce_scatter")
    _same_call(group, "fused_matmul_reduce_scatter", a.shape, a.dtype, dim=dim, b=tuple(b.shape))

    def summand(c: int) -> Any:                  # this rank's part of chunk c
        if columns:
            part = _matmul(a, b[:, c * size:(c + 1) * size])
        else:
            part = _matmul(_take(a, dim, c, size), b)
        return part if plus is None else part + _take(plus, dim, c, size)

    total = summand((rank + 1) % n)
    for step in range(1, n):
        incoming = xp.empty_like(total)
        pending = [dist.isend(total, prev, group, RING_TAG),
                   dist.irecv(incoming, nxt, group, RING_TAG)]
        part = summand((rank + step + 1) % n)    # while the running sums travel
        for handle in pending:
            handle.wait()
        total = incoming + part
    return total


class FusedAllGatherMatmul(Function):
    """(A, *Bs) -> (AG(A), AG(A) @ B_1, ...); backward: one fused matmul-reduce-scatter."""

    @staticmethod
    def forward(ctx, a_shard, *bs, gather_dim=0, group=None):
        a_full, outs = ring_all_gather_matmul(a_shard, list(bs), gather_dim, group)
        ctx.save_for_backward(a_full, *bs)
        ctx.dim, ctx.group = _axis(gather_dim, a_shard.ndim, "gather_dim"), group
        return (a_full, *outs)

    @staticmethod
    def backward(ctx, d_full, *d_outs):
        a_full, *bs = ctx.saved
        d_cat = xp.concatenate(list(d_outs), axis=-1)                # (..., sum of N_i)
        b_t = xp.concatenate([b.T for b in bs], axis=0)             # (sum of N_i, K)
        da = ring_matmul_reduce_scatter(d_cat, b_t, ctx.dim, ctx.group, plus=d_full)
        a2 = a_full.reshape(-1, a_full.shape[-1])                    # (M, K)
        dbs = [xp.matmul(a2.T, d.reshape(-1, d.shape[-1])) for d in d_outs]   # (K, N_i)
        return (da, *dbs)


class FusedMatmulReduceScatter(Function):
    """(A, B) -> RS(A @ B) ("sum" or "avg"); backward: one fused all-gather-matmul."""

    @staticmethod
    def forward(ctx, a, b, reduce_op="sum", scatter_dim=0, group=None):
        if reduce_op not in ("sum", "avg"):
            raise ValueError(f"fused_matmul_reduce_scatter: reduce_op must be 'sum' or "
                             f"'avg', got {reduce_op!r}")
        out = ring_matmul_reduce_scatter(a, b, scatter_dim, group)
        ctx.scale = 1.0 / dist.get_world_size(group) if reduce_op == "avg" else None
        ctx.dim, ctx.group = _axis(scatter_dim, a.ndim, "scatter_dim"), group
        ctx.save_for_backward(a, b)
        return out if ctx.scale is None else out * ctx.scale

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved
        grad = grad if ctx.scale is None else grad * ctx.scale
        g_full, (da,) = ring_all_gather_matmul(grad, [b.T], ctx.dim, ctx.group)
        a2 = a.reshape(-1, a.shape[-1])                               # (M, K)
        db = xp.matmul(a2.T, g_full.reshape(-1, g_full.shape[-1]))    # (K, N)
        return da, db, None, None, None


def fused_all_gather_matmul(a_shard: Tensor, bs: list, gather_dim: int,
                            group: Any = None) -> tuple[Tensor, list[Tensor]]:
    """``(a, [a @ b for b in bs])`` with ``a`` the all-gather of ``a_shard`` along
    ``gather_dim`` over ``group``, the gather overlapped with the products (torch's
    ``torch.ops.symm_mem.fused_all_gather_matmul``); differentiable."""
    if not bs:
        raise ValueError("fused_all_gather_matmul needs at least one B")
    a_full, *outs = FusedAllGatherMatmul.apply(a_shard, *bs, gather_dim=gather_dim,
                                               group=group)
    return a_full, outs


def fused_matmul_reduce_scatter(a: Tensor, b: Tensor, reduce_op: str = "sum",
                                scatter_dim: int = 0, group: Any = None) -> Tensor:
    """The reduce-scatter (``reduce_op`` "sum" or "avg") of ``a @ b`` along
    ``scatter_dim`` over ``group``, the products overlapped with the transfers (torch's
    ``torch.ops.symm_mem.fused_matmul_reduce_scatter``); differentiable."""
    return FusedMatmulReduceScatter.apply(a, b, reduce_op, scatter_dim, group)
