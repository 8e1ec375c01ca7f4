"""OCP Microscaling (MX v1.0): 32 elements share one power-of-two scale.

A block of k = 32 values V_1..V_k along one axis is stored as one E8M0 scale X
and k elements P_i of an element format (FP8 E4M3 / E5M2, FP6 E2M3 / E3M2, FP4
E2M1). The spec's conversion (section 6.3):

    shared_exp = floor(log2(max_i |V_i|)) - emax_elem
    X          = 2^shared_exp                            (E8M0: 2^-127 .. 2^127)
    P_i        = quantize(V_i / X, elem)                 (round to nearest even,
                                                          normals clamped to +-max)
    V_i ~= X * P_i                                       (mx_dequantize)

emax_elem is the exponent of the element format's largest binade (E4M3: 8,
E5M2: 15, E2M3: 2, E3M2: 4, E2M1: 2), so the block's largest value lands in
the element format's top binade [2^emax, 2^(emax+1)), where it may round past
the format's max and is clamped (E4M3 keeps 448 for 449..511.9).

Worked block (MXFP4, E2M1: values 0 .5 1 1.5 2 3 4 6, emax 2), amax = 10:
floor(log2 10) = 3, shared_exp = 3 - 2 = 1, X = 2. V = [10, -3, 0.7, 0.2]
-> V / X = [5, -1.5, 0.35, 0.1] -> P = [4, -1.5, 0.5, 0] -> X * P = [8, -3, 1, 0].

Edge cases, as decided here (the spec leaves them to the implementation):
- all-zero block: X = 2^-127 (E8M0 code 0), elements 0.
- shared_exp below -127 (tiny blocks): X = 2^-127. Above 127 (float64 input
  only): X = NaN.
- a block holding a NaN or an inf: X = NaN (the spec's NaN scale: the whole
  block decodes to NaN) and its elements 0.
- axis length not a multiple of 32: padded with zeros (block_layout.py).
- block size: the spec defines k = 32 only; others are refused (NVFP4's 16 is
  ``nvfp4_quantize``).

Matches torchao's ``to_mx`` (FLOOR scaling) bit for bit on finite blocks whose
shared exponent is above -127; torchao divides by 2^-126 where X = 2^-127 and
keeps a finite scale for blocks holding an inf.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.precision.block_layout import (block_amax, check_float_input, check_scale_shape,
                                             from_blocks, normalize_axis, scales_from_blocks,
                                             scales_to_blocks, to_blocks)
from minidist.precision.formats import E8M0FNU, FloatFormat, get_format
from minidist.precision.rounding import quantize, quiet
from minidist.precision.subnormals import exp2_float32, narrow, widen

MX_BLOCK_SIZE = 32
MX_ELEMENT_FORMATS = ("fp8_e4m3fn", "fp8_e5m2", "fp6_e2m3fn", "fp6_e3m2fn", "fp4_e2m1fn")


def mx_element_format(fmt: FloatFormat | str) -> FloatFormat:
    """The element format, if MX defines it; a ValueError naming the choices if not."""
    fmt = get_format(fmt)
    if fmt.name not in MX_ELEMENT_FORMATS:
        raise ValueError(f"{fmt.name} is not an MX element format; use one of "
                         f"{MX_ELEMENT_FORMATS}")
    return fmt


def _check_block_size(block_size: int) -> None:
    if block_size != MX_BLOCK_SIZE:
        raise ValueError(f"MX v1.0 defines block_size={MX_BLOCK_SIZE} only, got {block_size!r}; "
                         "for 16-element FP4 blocks use nvfp4_quantize")


def mx_shared_exponent(amax: Any, fmt: FloatFormat) -> Any:
    """floor(log2(amax)) - emax_elem per block, clamped to E8M0; NaN where undefined."""
    _, k = xp.frexp(amax)                       # amax = f * 2^k, f in [0.5, 1): floor(log2) = k - 1
    e = (k - 1 - fmt.emax).astype(amax.dtype)
    e = xp.maximum(e, E8M0FNU.emin)             # tiny blocks: the smallest scale 2^-127
    e[amax == 0] = E8M0FNU.emin                 # all-zero block: 2^-127 too
    e[~xp.isfinite(amax) | (e > E8M0FNU.emax)] = xp.nan
    return e


def mx_quantize(x: Any, fmt: FloatFormat | str, block_size: int = MX_BLOCK_SIZE,
                axis: int = -1, rounding: str = "nearest",
                rng: backend.Generator | None = None) -> tuple[Any, Any]:
    """MX-quantize x along ``axis``: (elements, scales).

    elements: x's shape and dtype, each a value of ``fmt``; scales: float32
    powers of two (or NaN), x's shape with the axis cut to ceil(n / 32).
    ``rounding="stochastic"`` rounds the elements stochastically (``rng``).
    """
    check_float_input(x, "mx_quantize")
    fmt = mx_element_format(fmt)
    _check_block_size(block_size)
    if str(x.dtype) == "float32" and backend.flushes_subnormals():   # keep x's subnormals
        elements, scales = mx_quantize(widen(x), fmt, block_size, axis, rounding, rng)
        return narrow(elements), scales
    axis = normalize_axis(axis, x.ndim, "mx_quantize")
    blocks = to_blocks(x, block_size, axis)                  # (..., nb, k)
    with quiet():
        amax = block_amax(blocks)                            # (..., nb); NaN if any is NaN
        e = mx_shared_exponent(amax, fmt)                    # (..., nb)
        bad = xp.isnan(e)
        e_int = xp.where(bad, 0, e).astype(xp.int32)
        inverse = xp.ldexp(xp.ones(e.shape, x.dtype), -e_int)   # 1 / X: 2^-125 .. 2^127
        scaled = blocks * inverse[..., None]                  # V / X: times a power of two
        scaled[bad] = 0                                       # a NaN-scale block's elements: 0
    elements = quantize(scaled, fmt, rounding=rounding, saturate=True, rng=rng)
    scales = exp2_float32(e_int)                              # 2^-127 is a float32 subnormal
    scales[bad] = xp.nan
    return from_blocks(elements, x.shape[axis], axis), scales_from_blocks(scales, axis)


def mx_dequantize(elements: Any, scales: Any, block_size: int = MX_BLOCK_SIZE,
                  axis: int = -1) -> Any:
    """X * P per block: the values an MX tensor stands for, in elements' dtype."""
    check_float_input(elements, "mx_dequantize")
    _check_block_size(block_size)
    axis = normalize_axis(axis, elements.ndim, "mx_dequantize")
    if str(elements.dtype) == "float32" and backend.flushes_subnormals():
        return narrow(dequantize_blocks(widen(elements), widen(scales), block_size, axis))
    return dequantize_blocks(elements, scales, block_size, axis)


def dequantize_blocks(elements: Any, scales: Any, block_size: int, axis: int) -> Any:
    """elements * their block's scale (exact for MX: a power of two times a short value)."""
    n = elements.shape[axis]
    want = elements.shape[:axis] + (-(-n // block_size),) + elements.shape[axis + 1:]
    check_scale_shape(scales, elements, want, f"blocks of {block_size} along axis {axis}")
    blocks = to_blocks(elements, block_size, axis)           # (..., nb, k)
    s = scales_to_blocks(scales, axis).astype(elements.dtype)   # (..., nb, 1)
    with quiet():
        return from_blocks(blocks * s, n, axis)
