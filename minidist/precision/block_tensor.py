"""``BlockScaledTensor``: block-quantized elements with the scales that go with them.

The quantize functions return loose (elements, scales) pairs; this keeps them
together with what decodes them (recipe, axis, block shape, per-tensor scale)
and knows its own storage cost:

    bits per element = element_bits + scale_bits / block_size (+ tensor_scale_bits / numel)

    MXFP8 8 + 8/32 = 8.25     MXFP6 6.25      MXFP4 4.25
    NVFP4 4 + 8/16 = 4.5 + 32/numel           FP8 1x128 tiles 8 + 32/128 = 8.25
    FP8 128x128 blocks 8 + 32/16384 = 8.002

the same figures as ``minidist.calc.block_format_bits`` (the closed form).

    t = BlockScaledTensor.quantize(x, "mxfp4")
    t.bits_per_element, t.dequantize()
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minidist.precision.blockwise_fp8 import (BLOCK, TILE, blockwise_fp8_dequantize,
                                              blockwise_fp8_quantize)
from minidist.precision.mx import mx_dequantize, mx_quantize
from minidist.precision.nvfp4 import nvfp4_dequantize, nvfp4_quantize

# recipe -> (element format, element bits, block size, scale bits, tensor-scale bits)
LAYOUTS = {
    "mxfp8": ("fp8_e4m3fn", 8, 32, 8, 0), "mxfp8_e5m2": ("fp8_e5m2", 8, 32, 8, 0),
    "mxfp6": ("fp6_e2m3fn", 6, 32, 8, 0), "mxfp6_e3m2": ("fp6_e3m2fn", 6, 32, 8, 0),
    "mxfp4": ("fp4_e2m1fn", 4, 32, 8, 0), "nvfp4": ("fp4_e2m1fn", 4, 16, 8, 32),
    "fp8_blockwise_tile": ("fp8_e4m3fn", 8, 128, 32, 0),
    "fp8_blockwise_block": ("fp8_e4m3fn", 8, 128 * 128, 32, 0),
}


@dataclass
class BlockScaledTensor:
    elements: Any            # values of the element format, the original shape
    scales: Any              # one per block (float32), see the quantize functions
    recipe: str              # a key of LAYOUTS
    axis: int = -1           # the blocked axis (MX, NVFP4)
    tensor_scale: Any = None  # NVFP4's FP32 per-tensor scale

    @classmethod
    def quantize(cls, x: Any, recipe: str, axis: int = -1) -> "BlockScaledTensor":
        if recipe not in LAYOUTS:
            raise ValueError(f"unknown recipe {recipe!r}; choose one of {sorted(LAYOUTS)}")
        if recipe == "nvfp4":
            e, s, t = nvfp4_quantize(x, axis=axis)
            return cls(e, s, recipe, axis, t)
        if recipe.startswith("fp8_blockwise"):
            e, s = blockwise_fp8_quantize(x, TILE if recipe.endswith("tile") else BLOCK)
            return cls(e, s, recipe)
        e, s = mx_quantize(x, LAYOUTS[recipe][0], axis=axis)
        return cls(e, s, recipe, axis)

    def dequantize(self) -> Any:
        if self.recipe == "nvfp4":
            return nvfp4_dequantize(self.elements, self.scales, self.tensor_scale, axis=self.axis)
        if self.recipe.startswith("fp8_blockwise"):
            block = TILE if self.recipe.endswith("tile") else BLOCK
            return blockwise_fp8_dequantize(self.elements, self.scales, block)
        return mx_dequantize(self.elements, self.scales, axis=self.axis)

    @property
    def element_format(self) -> str:
        return LAYOUTS[self.recipe][0]

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element, scales included (see the module docstring)."""
        _, bits, block, scale_bits, tensor_bits = LAYOUTS[self.recipe]
        return bits + scale_bits / block + tensor_bits / max(self.elements.size, 1)

    @property
    def nbytes(self) -> float:
        """Storage of elements and scales, packed: bits_per_element * numel / 8."""
        return self.bits_per_element * self.elements.size / 8
