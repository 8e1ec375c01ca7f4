"""Free functions over tensors, for ops that are not methods (like ``torch.cat``)."""
from __future__ import annotations

from typing import Sequence

from minidist.autograd import ops
from minidist.autograd.tensor import Tensor, array_of


def matmul(a, b) -> Tensor:
    return ops.MatMul.apply(a, b)


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    return ops.Concat.apply(*tensors, axis=axis)


def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    return ops.Stack.apply(*tensors, axis=axis)


def split(x: Tensor, split_size_or_sizes, axis: int = 0) -> tuple[Tensor, ...]:
    """Pieces of ``x`` along ``axis``: of one size (the last may be smaller), or
    of the listed sizes, as ``torch.split``."""
    n = x.shape[axis]
    if isinstance(split_size_or_sizes, int):
        if split_size_or_sizes <= 0:
            raise ValueError("split size must be positive")
        step = split_size_or_sizes
        sizes = [min(step, n - i) for i in range(0, n, step)]
    else:
        sizes = list(split_size_or_sizes)
    return ops.Split.apply(x, sizes, axis=axis)


def where(cond, a, b) -> Tensor:
    return ops.Where.apply(array_of(cond), a, b)
