"""The communication of tensor parallelism, as autograd ops (Megatron-LM's f and g).

Tensor parallelism (layers.py) splits each weight matrix across the t ranks of a
group. What moves between them is four conjugate pairs: each op's backward is
the *transpose* of its forward, so a forward copy becomes a backward sum and a
forward gather becomes a backward split.

    op                          forward                    backward
    f   copy_to_tp              identity (x on every rank)  all-reduce (sum dL/dx)
    g   reduce_from_tp          all-reduce (sum partials)   identity
        gather_from_tp          all-gather along an axis    keep my slice
        split_to_tp             keep my slice               all-gather
    sequence parallelism:
        gather_from_sp          all-gather along the        reduce-scatter along it
                                sequence axis
        reduce_scatter_to_sp    reduce-scatter along the    all-gather along it
                                sequence axis

Why f's backward sums: x is used by every rank (each rank's Y_i = X A_i), so
dL/dX = sum_i dL/dY_i A_i^T, one partial per rank. Why g's backward copies: the
forward output Z = sum_i Z_i is the same on every rank, so each partial Z_i
gets the whole dL/dZ. (Shoeybi et al., 2019, "Megatron-LM", section 3, fig. 3.)

Sequence parallelism (Korthikanti et al., 2022) replaces g by a reduce-scatter
(each rank keeps the summed output only for its T/t positions) and f by an
all-gather (the positions come back together before the next column-parallel
matmul): the same bytes as one all-reduce, which *is* reduce-scatter + all-gather,
but layer norm and dropout between them run on T/t positions per rank.

Every op takes the tensor-parallel ``group`` (None: the world). A group of one
rank makes every op the identity.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp


# -- array helpers: gather / reduce-scatter along any axis --------------------------

def _all_gather(x: Any, axis: int, group: Any) -> Any:
    """Every rank's ``x`` side by side along ``axis``, in rank order."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    out = xp.empty((n,) + tuple(x.shape), dtype=x.dtype)              # (n, *x.shape)
    dist.all_gather_into_tensor(out, xp.ascontiguousarray(x), group=group)
    return xp.concatenate([out[i] for i in range(n)], axis=axis)


def _reduce_scatter(x: Any, axis: int, group: Any) -> Any:
    """Sum ``x`` over the ranks; rank r keeps the r-th of n equal slices along ``axis``."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    if x.shape[axis] % n:
        raise ValueError(f"reduce-scatter: axis {axis} of length {x.shape[axis]} does not "
                         f"split into {n} equal parts")
    parts = xp.split(x, n, axis=axis)                                  # n x (.., L/n, ..)
    stacked = xp.stack([xp.ascontiguousarray(p) for p in parts])     # (n, .., L/n, ..)
    out = xp.empty(parts[0].shape, dtype=x.dtype)
    dist.reduce_scatter_tensor(out, stacked, group=group)
    return out


def _my_slice(x: Any, axis: int, group: Any) -> Any:
    """The r-th of n equal slices of ``x`` along ``axis`` (a copy)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[axis] % n:
        raise ValueError(f"split: axis {axis} of length {x.shape[axis]} does not split "
                         f"into {n} equal parts")
    return xp.ascontiguousarray(xp.split(x, n, axis=axis)[r])


def _all_reduce(x: Any, group: Any) -> Any:
    out = x.copy()  # never reduce into an input: the same array may feed other ops
    if dist.get_world_size(group) > 1:
        dist.all_reduce(out, group=group)
    return out


# -- the ops ------------------------------------------------------------------------

class CopyToTensorParallel(Function):
    """Megatron's f: forward identity, backward all-reduce of the gradient."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group)


class ReduceFromTensorParallel(Function):
    """Megatron's g: forward all-reduce (sum of partial outputs), backward identity."""

    @staticmethod
    def forward(ctx, x, group=None):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad


class GatherFromTensorParallel(Function):
    """Forward all-gather along ``axis``; backward keeps this rank's slice."""

    @staticmethod
    def forward(ctx, x, axis=-1, group=None):
        ctx.axis, ctx.group = axis, group
        return _all_gather(x, axis, group)

    @staticmethod
    def backward(ctx, grad):
        return _my_slice(grad, ctx.axis, ctx.group)


class SplitToTensorParallel(Function):
    """Forward keeps this rank's slice along ``axis``; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, axis=-1, group=None):
        ctx.axis, ctx.group = axis, group
        return _my_slice(x, axis, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.axis, ctx.group)


class GatherFromSequenceParallel(Function):
    """Sequence-parallel f: all-gather the positions forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, axis=1, group=None):
        ctx.axis, ctx.group = axis, group
        return _all_gather(x, axis, group)              # (B, T/t, C) -> (B, T, C)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.axis, ctx.group)  # (B, T, C) -> (B, T/t, C)


class ReduceScatterToSequenceParallel(Function):
    """Sequence-parallel g: reduce-scatter the partial sums forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, axis=1, group=None):
        ctx.axis, ctx.group = axis, group
        return _reduce_scatter(x, axis, group)          # (B, T, C) -> (B, T/t, C)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.axis, ctx.group)   # (B, T/t, C) -> (B, T, C)


# -- the functions layers call ------------------------------------------------------

def copy_to_tp(x: Tensor, group: Any = None) -> Tensor:
    """f: identity forward, all-reduce backward."""
    return CopyToTensorParallel.apply(x, group=group)


def reduce_from_tp(x: Tensor, group: Any = None) -> Tensor:
    """g: all-reduce forward, identity backward."""
    return ReduceFromTensorParallel.apply(x, group=group)


def gather_from_tp(x: Tensor, axis: int = -1, group: Any = None) -> Tensor:
    return GatherFromTensorParallel.apply(x, axis=axis, group=group)


def split_to_tp(x: Tensor, axis: int = -1, group: Any = None) -> Tensor:
    return SplitToTensorParallel.apply(x, axis=axis, group=group)


def gather_from_sp(x: Tensor, axis: int = 1, group: Any = None) -> Tensor:
    return GatherFromSequenceParallel.apply(x, axis=axis, group=group)


def reduce_scatter_to_sp(x: Tensor, axis: int = 1, group: Any = None) -> Tensor:
    return ReduceScatterToSequenceParallel.apply(x, axis=axis, group=group)
