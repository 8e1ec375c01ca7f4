"""Number-format ranges and dynamic loss scaling (workbook ch. 8, quiz Q10-Q11).

A binary float with e exponent bits and m mantissa bits has bias 2^(e-1) - 1:

    smallest normal      2^(1 - bias)                   FP16: 2^-14 = 6.1e-5
    smallest subnormal   2^(1 - bias - m)               FP16: 2^-24 = 5.96e-8
    largest finite       (2 - 2^-m) x 2^(2^e - 2 - bias)       IEEE-style (FP16, BF16, E5M2)
                         (2 - 2^(1-m)) x 2^(2^e - 1 - bias)    "fn" (E4M3FN: 448)

The "fn" formats (finite, NaN only) give up infinities and use the top exponent
for numbers, keeping only the all-ones mantissa there for NaN. The bit-exact
formats themselves live in ``minidist.precision``; these are the closed forms.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple


def _bias(exponent_bits: int) -> int:
    return 2 ** (exponent_bits - 1) - 1


def format_min_normal(exponent_bits: int) -> float:
    """Smallest positive normal number: 2^(1 - bias). Workbook 8.1: FP16 -> 6.1035e-5."""
    return 2.0 ** (1 - _bias(exponent_bits))


def format_min_subnormal(exponent_bits: int, mantissa_bits: int) -> float:
    """Smallest positive subnormal: 2^(1 - bias - m). Quiz Q11: FP16 -> 5.96e-8."""
    return 2.0 ** (1 - _bias(exponent_bits) - mantissa_bits)


def format_max(exponent_bits: int, mantissa_bits: int, finite_only: bool = False) -> float:
    """Largest finite number of the format (see the module docstring).

    Quiz Q11: FP16 (5, 10) -> 65504, BF16 (8, 7) -> 3.4e38; workbook ch. 8:
    E4M3 (4, 3, finite_only) -> 448, E5M2 (5, 2) -> 57344.
    """
    bias = _bias(exponent_bits)
    if finite_only:
        top_exponent = 2**exponent_bits - 1 - bias
        return (2.0 - 2.0 ** (1 - mantissa_bits)) * 2.0**top_exponent
    top_exponent = 2**exponent_bits - 2 - bias
    return (2.0 - 2.0**-mantissa_bits) * 2.0**top_exponent


def dynamic_loss_scale(overflows: Iterable[bool], init_scale: float = 65536.0,
                       growth_interval: int = 2000, backoff_factor: float = 0.5,
                       growth_factor: float = 2.0) -> float:
    """The loss scale after a run of steps under dynamic loss scaling (workbook 8.2, 8.6).

    An overflow (inf/nan gradient) skips the step and multiplies S by 0.5;
    growth_interval good steps in a row multiply it by 2. Workbook 8.2:
    65536 with overflows at steps 2 and 4 of 5 -> 16384.
    """
    scale = init_scale
    good_steps = 0
    for overflow in overflows:
        if overflow:
            scale *= backoff_factor
            good_steps = 0
        else:
            good_steps += 1
            if good_steps >= growth_interval:
                scale *= growth_factor
                good_steps = 0
    return scale


class BlockFormat(NamedTuple):
    element_bits: int       # bits of one element
    block_size: int         # elements sharing one scale
    scale_bits: int         # bits of that scale
    tensor_scale_bits: int  # bits of a scale shared by the whole tensor (0: none)


# OCP MX v1.0 (E8M0 scale per 32), NVFP4 (E4M3 per 16 + FP32 per tensor),
# DeepSeek-V3 FP8 (FP32 per 1x128 tile / per 128x128 block), per-tensor FP8 / BF16
BLOCK_FORMATS = {
    "mxfp8": BlockFormat(8, 32, 8, 0), "mxfp6": BlockFormat(6, 32, 8, 0),
    "mxfp4": BlockFormat(4, 32, 8, 0), "nvfp4": BlockFormat(4, 16, 8, 32),
    "fp8_blockwise_tile": BlockFormat(8, 128, 32, 0),
    "fp8_blockwise_block": BlockFormat(8, 128 * 128, 32, 0),
    "fp8_per_tensor": BlockFormat(8, 1, 0, 32), "bf16": BlockFormat(16, 1, 0, 0),
}


def block_format_bits(fmt: "BlockFormat | str", numel: float = 0) -> float:
    """Storage bits per element of a block-scaled format:

        bits = element_bits + scale_bits / block_size + tensor_scale_bits / numel

    MXFP8 8 + 8/32 = 8.25, MXFP6 6.25, MXFP4 4.25; NVFP4 4 + 8/16 = 4.5 plus
    32/numel for the FP32 tensor scale; DeepSeek-V3 FP8 8 + 32/128 = 8.25 per
    1x128 tile, 8 + 32/16384 = 8.002 per 128x128 block. ``numel`` = 0 leaves the
    per-tensor term out (its limit for a large tensor).
    """
    if isinstance(fmt, str):
        if fmt not in BLOCK_FORMATS:
            raise ValueError(f"unknown block format {fmt!r}; choose one of {sorted(BLOCK_FORMATS)}")
        fmt = BLOCK_FORMATS[fmt]
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    per_tensor = fmt.tensor_scale_bits / numel if numel else 0.0
    return fmt.element_bits + fmt.scale_bits / fmt.block_size + per_tensor
