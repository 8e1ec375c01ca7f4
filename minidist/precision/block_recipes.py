"""The block-scaled formats as one table of records: what each recipe stores and
which functions quantize and decode it.

    recipe                element   bits  block     scale        per tensor
    mxfp8 / mxfp8_e5m2    E4M3/E5M2  8    32        E8M0 (8)     -
    mxfp6 / mxfp6_e3m2    E2M3/E3M2  6    32        E8M0 (8)     -
    mxfp4                 E2M1       4    32        E8M0 (8)     -
    nvfp4                 E2M1       4    16        E4M3 (8)     FP32 (32)
    fp8_blockwise_tile    E4M3       8    1 x 128   FP32 (32)    -
    fp8_blockwise_block   E4M3       8    128x128   FP32 (32)    -

Every recipe quantizes along one axis, ``quantize(x, axis, rounding, rng) ->
(elements, scales, tensor_scale or None)``, and ``dequantize(elements, scales,
tensor_scale, axis)`` inverts it. The DeepSeek-V3 tiles run along the last axis,
so for another axis the tile recipe quantizes the transpose (a 128x128 block is
the same either way); its scales are FP32 and its rounding always to nearest.
``BlockScaledTensor`` (block_tensor.py) and ``BlockScaling`` (block_linear.py)
both look a recipe up here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from minidist.backend import xp
from minidist.precision.blockwise_fp8 import (BLOCK, TILE, blockwise_fp8_dequantize,
                                              blockwise_fp8_quantize)
from minidist.precision.mx import mx_dequantize, mx_quantize
from minidist.precision.nvfp4 import nvfp4_dequantize, nvfp4_quantize


@dataclass(frozen=True)
class BlockRecipe:
    element_format: str      # the elements' format (formats.py)
    element_bits: int        # bits per stored element
    block_size: int          # elements that share one scale
    scale_bits: int          # bits per block scale
    tensor_scale_bits: int   # bits of a per-tensor scale (NVFP4's FP32), else 0
    quantize: Callable       # (x, axis, rounding, rng) -> (elements, scales, tensor scale)
    dequantize: Callable     # (elements, scales, tensor scale, axis) -> values


def _mx(fmt: str, bits: int) -> BlockRecipe:
    return BlockRecipe(fmt, bits, 32, 8, 0,
                       lambda x, axis, rounding, rng: (*mx_quantize(
                           x, fmt, axis=axis, rounding=rounding, rng=rng), None),
                       lambda e, s, t, axis: mx_dequantize(e, s, axis=axis))


def _nvfp4() -> BlockRecipe:
    return BlockRecipe("fp4_e2m1fn", 4, 16, 8, 32,
                       lambda x, axis, rounding, rng: nvfp4_quantize(
                           x, axis=axis, rounding=rounding, rng=rng),
                       lambda e, s, t, axis: nvfp4_dequantize(e, s, t, axis=axis))


def _blockwise(block: tuple) -> BlockRecipe:
    def across(axis: int, a: Any) -> bool:
        """1 x 128 tiles asked to run along the first axis: work on the transpose."""
        return block == TILE and axis not in (-1, a.ndim - 1)

    def quantize(x, axis, rounding, rng):                      # always to nearest
        if across(axis, x):
            e, s = blockwise_fp8_quantize(xp.ascontiguousarray(x.T), block)
            return xp.ascontiguousarray(e.T), s, None
        return (*blockwise_fp8_quantize(x, block), None)

    def dequantize(e, s, t, axis):
        if across(axis, e):
            out = blockwise_fp8_dequantize(xp.ascontiguousarray(e.T), s, block)
            return xp.ascontiguousarray(out.T)
        return blockwise_fp8_dequantize(e, s, block)
    return BlockRecipe("fp8_e4m3fn", 8, block[0] * block[1], 32, 0, quantize, dequantize)


RECIPES = {
    "mxfp8": _mx("fp8_e4m3fn", 8), "mxfp8_e5m2": _mx("fp8_e5m2", 8),
    "mxfp6": _mx("fp6_e2m3fn", 6), "mxfp6_e3m2": _mx("fp6_e3m2fn", 6),
    "mxfp4": _mx("fp4_e2m1fn", 4), "nvfp4": _nvfp4(),
    "fp8_blockwise_tile": _blockwise(TILE), "fp8_blockwise_block": _blockwise(BLOCK),
}


def block_recipe(name: str) -> BlockRecipe:
    """The record of recipe ``name``; a clear error for an unknown one."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]
