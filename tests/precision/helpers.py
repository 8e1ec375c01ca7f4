"""Shared oracles for the precision tests: reference casts and exact rounding.

``REFERENCE`` maps our formats to the dtypes that implement them (NumPy's
float16, ml_dtypes' bfloat16 and fp8 types); ``exact_round`` rounds a Fraction
with integer arithmetic only, the oracle for float64 inputs.
"""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

from minidist import backend
from minidist.precision import (BF16, FP8_E4M3FN, FP8_E4M3FNUZ, FP8_E5M2, FP8_E5M2FNUZ, FP16,
                                FloatFormat)

REFERENCE = {
    FP16: np.float16,
    BF16: ml_dtypes.bfloat16,
    FP8_E4M3FN: ml_dtypes.float8_e4m3fn,
    FP8_E5M2: ml_dtypes.float8_e5m2,
    FP8_E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    FP8_E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    # ExMy formats described by their bits, checked against ml_dtypes too
    FloatFormat("e4m3_ieee", 4, 3): ml_dtypes.float8_e4m3,
    FloatFormat("e3m4_ieee", 3, 4): ml_dtypes.float8_e3m4,
    FloatFormat("e4m3b11fnuz", 4, 3, bias=11, special="fnuz"): ml_dtypes.float8_e4m3b11fnuz,
}
MAIN = [FP16, BF16, FP8_E4M3FN, FP8_E5M2]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equal, any NaN equal to any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    ua, ub = a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")
    return bool(np.all((ua == ub) | (np.isnan(a) & np.isnan(b))))


def first_difference(x: np.ndarray, got: np.ndarray, want: np.ndarray) -> str:
    bad = ~((got.view(f"u{got.itemsize}") == want.view(f"u{want.itemsize}"))
            | (np.isnan(got) & np.isnan(want)))
    i = int(np.flatnonzero(bad)[0])
    return f"x={x.flat[i]!r} (bits {x.view(f'u{x.itemsize}').flat[i]:#x}): got {got.flat[i]!r}, want {want.flat[i]!r}"


def reference_cast(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """x rounded to fmt by the reference dtype, back in x's dtype (float32 input)."""
    with np.errstate(all="ignore"):
        return x.astype(REFERENCE[fmt]).astype(x.dtype)


def quantize_host(x: np.ndarray, fmt, **kw) -> np.ndarray:
    """minidist's quantize on host data, through the active backend."""
    from minidist.precision import quantize
    return backend.to_host(quantize(backend.from_host(x), fmt, **kw))


def exact_round(x: float, fmt: FloatFormat, saturate: bool = False) -> float:
    """Round-to-nearest-even of the exact value of x, with Fractions (the oracle)."""
    over = math.copysign(fmt.max, x) if saturate else (
        math.copysign(math.inf, x) if fmt.has_inf else math.nan)
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return over
    a = abs(Fraction(x))
    if a == 0:
        return 0.0 if not fmt.has_negative_zero else math.copysign(0.0, x)
    e = a.numerator.bit_length() - a.denominator.bit_length()   # 2^e <= a < 2^(e+2)
    if Fraction(2) ** e > a:
        e -= 1
    elif Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (max(e, fmt.emin) - fmt.man_bits)
    y = round(a / q) * q                         # Fraction rounding: half to even
    if y > Fraction(fmt.max):
        return over
    if y == 0 and not fmt.has_negative_zero:
        return 0.0
    return math.copysign(float(y), x)
