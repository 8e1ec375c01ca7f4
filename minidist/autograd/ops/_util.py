"""Small helpers shared by the op files."""
from __future__ import annotations

from typing import Any


def shape_of(x: Any) -> tuple:
    """Shape of an array, or () for a Python / NumPy scalar."""
    return tuple(getattr(x, "shape", ()))


def unbroadcast(grad: Any, shape: tuple) -> Any:
    """Sum ``grad`` down to ``shape``: the backward of NumPy broadcasting.

    A dimension that broadcasting added in front, or stretched from size 1,
    received the same input value many times, so its gradient is the sum.
    """
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape)


def normalize_axes(axis: Any, ndim: int) -> tuple:
    """``None`` -> every axis; int or tuple -> a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    axes = tuple(sorted(a % ndim if ndim else a for a in axis))
    for a in axes:
        if ndim and not 0 <= a < ndim:
            raise ValueError(f"axis {a} is out of range for {ndim} dimensions")
    return axes


def expand_reduced(grad: Any, in_shape: tuple, axes: tuple, keepdims: bool) -> Any:
    """Put back the reduced axes of ``grad`` (size 1) so it broadcasts to ``in_shape``."""
    if not keepdims:
        shape = list(in_shape)
        for a in axes:
            shape[a] = 1
        grad = grad.reshape(shape)
    return grad
