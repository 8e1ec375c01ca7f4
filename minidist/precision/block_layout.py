"""Cutting one axis of an array into blocks, and putting it back: ``to_blocks``.

Every block-scaled format (MX, NVFP4, blockwise FP8) gives each run of
``block_size`` consecutive elements along one axis its own scale. The axis is
moved last and cut:

    x (..., n, ...)  --moveaxis-->  (..., n)  --pad-->  (..., nb * k)  --reshape-->  (..., nb, k)

with ``nb = ceil(n / k)``. A length that is not a multiple of k is padded with
zeros: a zero changes no block's amax, so the padded elements quantize to zero
and the real ones exactly as they would in a full block (the OCP MX spec lets
an implementation pad a short final block this way). ``from_blocks`` drops the
padding and moves the axis back. Scales keep the block axis where the cut axis
was: shape ``x.shape`` with ``n`` replaced by ``nb``.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.backend import xp


def check_float_input(x: Any, what: str) -> None:
    """Refuse what a block format cannot take: non-arrays and non-float arrays."""
    if not backend.is_array(x):
        raise TypeError(f"{what} takes an array of the active backend "
                        f"({backend.get_backend()}), got {type(x).__name__}; "
                        "use backend.from_host(...)")
    if str(x.dtype) not in ("float32", "float64"):
        raise TypeError(f"{what} takes float32 or float64 values, got {x.dtype}; "
                        "cast first, e.g. x.astype('float32')")


def normalize_axis(axis: int, ndim: int, what: str) -> int:
    if not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ValueError(f"{what}: axis {axis!r} is out of range for an array of {ndim} dims")
    return axis % ndim


def to_blocks(x: Any, block_size: int, axis: int) -> Any:
    """(..., n, ...) -> (..., nb, k): axis moved last, zero-padded, cut into blocks of k."""
    moved = xp.moveaxis(x, axis, -1)                  # (..., n)
    n = moved.shape[-1]
    pad = -n % block_size
    if pad:
        widths = [(0, 0)] * (moved.ndim - 1) + [(0, pad)]
        moved = xp.pad(moved, widths)                 # (..., nb * k), zeros at the end
    return moved.reshape(moved.shape[:-1] + (-1, block_size))   # (..., nb, k)


def from_blocks(blocks: Any, n: int, axis: int) -> Any:
    """(..., nb, k) -> (..., n, ...): the inverse of ``to_blocks``, padding dropped."""
    flat = blocks.reshape(blocks.shape[:-2] + (-1,))[..., :n]   # (..., n)
    return xp.ascontiguousarray(xp.moveaxis(flat, -1, axis))


def scales_from_blocks(scales: Any, axis: int) -> Any:
    """(..., nb) per-block values -> x's layout with nb where the axis was."""
    return xp.ascontiguousarray(xp.moveaxis(scales, -1, axis))


def scales_to_blocks(scales: Any, axis: int) -> Any:
    """x-layout scales -> (..., nb, 1), to broadcast against (..., nb, k) blocks."""
    return xp.moveaxis(scales, axis, -1)[..., None]


def block_amax(blocks: Any) -> Any:
    """max |x| over each block's last axis (NaN if the block holds one), read from the
    bits: a float's magnitude orders as its bit pattern does, NaN's above inf's. Exact
    where float32 arithmetic reads a subnormal as 0 (CuPy), where xp.max(xp.abs(...)) is not."""
    sign = 1 << (8 * blocks.itemsize - 1)
    magnitude = backend.bits(blocks) & getattr(xp, f"uint{8 * blocks.itemsize}")(sign - 1)
    return backend.from_bits(xp.max(magnitude, axis=-1), blocks.dtype)


def check_scale_shape(scales: Any, elements: Any, want: tuple, blocking: str) -> None:
    """The one check every block format's decoder makes: a scale per block."""
    if tuple(scales.shape) != tuple(want):
        raise ValueError(f"scales have shape {tuple(scales.shape)}; elements of shape "
                         f"{tuple(elements.shape)} in {blocking} need {tuple(want)}")
