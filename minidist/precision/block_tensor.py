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

from minidist.precision.block_recipes import RECIPES, block_recipe


@dataclass
class BlockScaledTensor:
    elements: Any            # values of the element format, the original shape
    scales: Any              # one per block (float32), see the quantize functions
    recipe: str              # a key of block_recipes.RECIPES
    axis: int = -1           # the blocked axis (MX, NVFP4, 1 x 128 tiles)
    tensor_scale: Any = None  # NVFP4's FP32 per-tensor scale

    @classmethod
    def quantize(cls, x: Any, recipe: str, axis: int = -1) -> "BlockScaledTensor":
        elements, scales, tensor_scale = block_recipe(recipe).quantize(x, axis, "nearest", None)
        return cls(elements, scales, recipe, axis, tensor_scale)

    def dequantize(self) -> Any:
        return RECIPES[self.recipe].dequantize(self.elements, self.scales, self.tensor_scale,
                                               self.axis)

    @property
    def element_format(self) -> str:
        return RECIPES[self.recipe].element_format

    @property
    def bits_per_element(self) -> float:
        """Storage bits per element, scales included (see the module docstring)."""
        r = RECIPES[self.recipe]
        return (r.element_bits + r.scale_bits / r.block_size
                + r.tensor_scale_bits / max(self.elements.size, 1))

    @property
    def nbytes(self) -> float:
        """Storage of elements and scales, packed: bits_per_element * numel / 8."""
        return self.bits_per_element * self.elements.size / 8
