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

from typing import Iterable


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
