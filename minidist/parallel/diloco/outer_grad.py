"""The outer gradient's precision on the wire (Streaming DiLoCo's quantised outer gradients).

Each replica rounds its outer gradient Delta = theta_global - theta_local to a low
precision format before the reduction (``outer_grad_format``). Outer gradients are
small (a few steps' worth of updates), far below the smallest FP4 / FP8 values, so
each tensor is first scaled by one power of two, chosen so its largest magnitude
just fits the format (as the MX formats scale a block, with the scale exact):

    s = 2^ceil(log2(max|Delta| / fmt.max))
    Delta_q = s * round(Delta / s)                   (round: nearest even, saturating)

A real wire carries the fmt.bits-bit codes plus one scale per tensor: bits / 32 of the
float32 bytes (``minidist calc diloco``). Here the rounded values travel as floats:
the arithmetic is the quantised one, the emulated wire's byte count is not.
"""
from __future__ import annotations

import math
from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.precision import FloatFormat, get_format, quantize

# the formats Streaming DiLoCo's experiments use; any other minidist format works too
SUGGESTED = ("bf16", "e4m3fn", "e5m2", "e2m1fn", "e3m0")


def outer_grad_format(name: "str | FloatFormat | None") -> FloatFormat | None:
    """The format of ``outer_grad_format`` (None: full precision), or a clear error."""
    if name is None:
        return None
    try:
        fmt = get_format(name)
    except ValueError:
        raise ValueError(f"unknown outer_grad_format {name!r}; use None (full precision) or "
                         f"one of {list(SUGGESTED)}") from None
    if not fmt.signed:
        raise ValueError(f"outer_grad_format {fmt.name} has no sign bit (it is a scale "
                         f"format); use one of {list(SUGGESTED)}")
    return fmt


def scale_exponent(amax: float, fmt: FloatFormat) -> int:
    """The smallest k with amax / 2^k <= fmt.max (0 for a zero or non-finite amax)."""
    if not (amax > 0 and math.isfinite(amax)):
        return 0
    m, e = math.frexp(amax / fmt.max)          # ratio = m * 2^e, 0.5 <= m < 1
    return e - 1 if m == 0.5 else e            # ceil(log2(ratio))


def round_outer_gradient(delta: Any, fmt: FloatFormat | None) -> Any:
    """``delta`` rounded to ``fmt`` under one power-of-two scale (a new array), or
    ``delta`` itself when ``fmt`` is None."""
    if fmt is None:
        return delta
    amax = float(backend.to_host(xp.max(xp.abs(delta)))) if delta.size else 0.0
    k = scale_exponent(amax, fmt)
    scaled = xp.ldexp(delta, -k)                 # Delta / s, exact (s = 2^k may not fit a float32)
    return xp.ldexp(quantize(scaled, fmt, saturate=True), k)
