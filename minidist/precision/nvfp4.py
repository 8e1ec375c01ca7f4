"""NVFP4: 16 FP4 (E2M1) elements share an E4M3 scale, under one FP32 scale per tensor.

Two levels of scaling (NVIDIA's recipe, as in Transformer Engine and torchao):

    s_tensor = amax(x) / (6 * 448)                     FP32, one per tensor
    s_block  = e4m3( (amax(block) / 6) / s_tensor )    E4M3, one per 16 elements
    P_i      = e2m1( V_i * ((1 / s_tensor) / s_block) )   nearest even (or stochastic),
                                                          saturating at +-6
    V_i     ~= P_i * (s_block * s_tensor)              (nvfp4_dequantize)

6 is E2M1's max and 448 E4M3's: the block holding the tensor's amax gets
s_block = 448, the top of E4M3, so the smaller blocks use E4M3's whole range
(down to 2^-9) before their scales underflow. Unlike MX's power-of-two scale,
an E4M3 scale has 3 mantissa bits, so amax / 6 is met to within 1/16 and the
block's largest element lands near 6 instead of anywhere in [4, 8).

The elementwise product uses the reciprocal (1 / s_tensor) / s_block, in FP32,
as NVIDIA's kernels do; the test's reference follows the same steps.

Edge cases, as decided here:
- s_tensor is computed from the finite values; an all-zero (or all non-finite)
  tensor gets s_tensor = 1. A block holding a NaN or inf gets s_block = NaN
  (its elements 0), the others are unaffected.
- s_block is clamped to [2^-9, 448] (E4M3's smallest subnormal; an all-zero
  block gets 2^-9 and elements 0). torchao clamps at E4M3's smallest normal,
  2^-6, instead; the two agree bit for bit on every block whose scale is >= 2^-6.
- a tensor amax below about 2^-100 overflows the FP32 reciprocal 1 / s_tensor /
  s_block for its smallest blocks (as in the kernels); rescale such a tensor first.
- axis length not a multiple of 16: padded with zeros (block_layout.py);
  block sizes other than 16 are refused.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.precision.block_layout import (block_amax, check_float_input, check_scale_shape,
                                             from_blocks, normalize_axis, scales_from_blocks,
                                             scales_to_blocks, to_blocks)
from minidist.precision.formats import FP4_E2M1FN, FP8_E4M3FN
from minidist.precision.rounding import quantize, quiet

NVFP4_BLOCK_SIZE = 16


def _check_block_size(block_size: int) -> None:
    if block_size != NVFP4_BLOCK_SIZE:
        raise ValueError(f"NVFP4 uses block_size={NVFP4_BLOCK_SIZE}, got {block_size!r}; "
                         "for 32-element blocks use mx_quantize(x, 'fp4_e2m1fn')")


def nvfp4_tensor_scale(x: Any) -> Any:
    """s_tensor = amax / (6 * 448) over x's finite values, as a float32 0-d array (1 if none)."""
    with quiet():
        x = x.astype("float32", copy=False)             # max, then cast: the same value
        amax = block_amax(xp.where(xp.isfinite(x), x, xp.float32(0)).reshape(-1))
    scale = amax / xp.float32(FP4_E2M1FN.max * FP8_E4M3FN.max)
    return xp.where(amax > 0, scale, xp.float32(1.0)).astype("float32")


def nvfp4_quantize(x: Any, block_size: int = NVFP4_BLOCK_SIZE, axis: int = -1,
                   tensor_scale: Any = None, rounding: str = "nearest",
                   rng: backend.Generator | None = None) -> tuple[Any, Any, Any]:
    """NVFP4-quantize x along ``axis``: (elements, block_scales, tensor_scale).

    elements: x's shape, float32 values of E2M1; block_scales: float32 values of
    E4M3 (or NaN), x's shape with the axis cut to ceil(n / 16); tensor_scale: a
    float32 0-d array (pass one in to reuse a calibrated scale).
    """
    check_float_input(x, "nvfp4_quantize")
    _check_block_size(block_size)
    axis = normalize_axis(axis, x.ndim, "nvfp4_quantize")
    x = x.astype("float32", copy=False)
    s_tensor = nvfp4_tensor_scale(x) if tensor_scale is None else \
        xp.asarray(tensor_scale, dtype="float32")
    blocks = to_blocks(x, block_size, axis)                     # (..., nb, 16)
    with quiet():
        amax = block_amax(blocks)                               # (..., nb)
        bad = ~xp.isfinite(amax)
        s_block = (amax / xp.float32(FP4_E2M1FN.max)) / s_tensor
        s_block = xp.clip(s_block, FP8_E4M3FN.smallest_subnormal, FP8_E4M3FN.max)
        s_block = quantize(s_block.astype("float32"), FP8_E4M3FN, saturate=True)
        s_block[bad] = 1                                        # keep the arithmetic finite
        reciprocal = (xp.float32(1) / s_tensor) / s_block       # (..., nb), FP32
        scaled = blocks * reciprocal[..., None]                 # (..., nb, 16)
        scaled[bad | (backend.bits(amax) == 0)] = 0              # 0 * an overflowed reciprocal
    elements = quantize(scaled, FP4_E2M1FN, rounding=rounding, saturate=True, rng=rng)
    s_block[bad] = xp.nan
    return (from_blocks(elements, x.shape[axis], axis), scales_from_blocks(s_block, axis),
            s_tensor)


def nvfp4_dequantize(elements: Any, block_scales: Any, tensor_scale: Any,
                     block_size: int = NVFP4_BLOCK_SIZE, axis: int = -1) -> Any:
    """P * (s_block * s_tensor) per block, float32."""
    check_float_input(elements, "nvfp4_dequantize")
    _check_block_size(block_size)
    axis = normalize_axis(axis, elements.ndim, "nvfp4_dequantize")
    n = elements.shape[axis]
    want = elements.shape[:axis] + (-(-n // block_size),) + elements.shape[axis + 1:]
    check_scale_shape(block_scales, elements, want, f"blocks of {block_size} along axis {axis}")
    blocks = to_blocks(elements.astype("float32", copy=False), block_size, axis)  # (..., nb, 16)
    with quiet():
        s = scales_to_blocks(block_scales, axis) * xp.asarray(tensor_scale, dtype="float32")
        return from_blocks(blocks * s.astype("float32"), n, axis)
