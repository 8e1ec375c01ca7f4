"""The outer gradient's precision on the wire (Streaming DiLoCo's quantised outer gradients).

Each replica rounds its outer gradient Delta = theta_global - theta_local to a low
precision format before the reduction (``outer_grad_format``). Outer gradients are
small (a few steps' worth of updates), far below the smallest FP4 / FP8 values, so
each tensor is first scaled by one power of two, chosen so its largest magnitude
just fits the format (as the MX formats scale a block, with the scale exact):

    s = 2^ceil(log2(max|Delta| / fmt.max))
    Delta_q = s * round(Delta / s)                   (round: nearest even, saturating)

What travels are the codes (``precision.encode``: fmt.bits bits each, two 4-bit codes
per byte) and one int32 scale exponent k per tensor, ``encode_outer_gradients``:

    wire = [ codes of every tensor's Delta / s, side by side | k of each tensor ]
           ceil(n * bits / 8) + 4 * tensors bytes            (float32: 4 n)

Every replica's wire is all-gathered (the codes cannot be added as codes), and each
rank decodes the N of them and adds them in rank order (``mean_of_encoded``):

    mean = (Delta_q,0 + Delta_q,1 + ... + Delta_q,N-1) / N     the same bits everywhere

With a ``shard_group`` (shard.py) a rank sends the codes of its slice lo:hi of the
values only (and every exponent); ``mean_of_encoded`` then returns that slice's mean.

An all-gather moves (N-1) * W bytes per rank: for N = 2 what a ring all-reduce of the
codes would, bits / 32 of the float32 all-reduce's; for larger N, N / 2 times that (a
quantised all-reduce keeps bits / 32 by rounding the partial sums again, which changes
the mean; torchft does so).
"""
from __future__ import annotations

import math
from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.precision import FloatFormat, get_format, quantize
from minidist.precision.encoding import decode, encode

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
    k = _exponent(delta, fmt)
    scaled = xp.ldexp(delta, -k)                 # Delta / s, exact (s = 2^k may not fit a float32)
    return xp.ldexp(quantize(scaled, fmt, saturate=True), k)


def _exponent(delta: Any, fmt: FloatFormat) -> int:
    amax = float(backend.to_host(xp.max(xp.abs(delta)))) if delta.size else 0.0
    return scale_exponent(amax, fmt)


def encode_outer_gradients(deltas: list, fmt: FloatFormat, lo: int = 0,
                           hi: int | None = None) -> Any:
    """The wire of one replica (module docstring): (W,) uint8, the codes of each
    ``delta`` under its scale (4-bit codes two to a byte), then each scale's exponent.
    ``lo:hi``: only those values of the deltas laid end to end (a rank's slice,
    shard.py); each scale still comes from its whole tensor."""
    exponents = [_exponent(d, fmt) for d in deltas]
    codes = xp.concatenate([encode(xp.ldexp(d, -k).reshape(-1), fmt, saturate=True)
                            for d, k in zip(deltas, exponents)])            # (n,) codes
    codes = codes[lo:hi]                                                    # (hi - lo,)
    if fmt.bits <= 4:
        codes = xp.concatenate([codes, xp.zeros(codes.size % 2, dtype=codes.dtype)])
        codes = codes[0::2] | (codes[1::2] << 4)                            # (ceil(n/2),)
    scales = xp.asarray(exponents, dtype=xp.int32)                          # (tensors,)
    return xp.concatenate([xp.ascontiguousarray(codes).view(xp.uint8), scales.view(xp.uint8)])


def mean_of_encoded(gathered: Any, sizes: list[int], fmt: FloatFormat, dtype: Any,
                    lo: int = 0, hi: int | None = None) -> Any:
    """The mean over the rows of ``gathered`` ((N, W) uint8: every replica's wire) of the
    decoded outer gradients, added in rank order: (hi - lo,) of ``dtype``, values
    ``lo:hi`` of the tensors of ``sizes`` laid end to end (default: all of them)."""
    tensors = len(sizes)
    hi = sum(sizes) if hi is None else hi
    total = None
    for row in gathered:
        code_bytes = xp.ascontiguousarray(row[:row.size - 4 * tensors])
        exponents = backend.to_host(row[row.size - 4 * tensors:].copy().view(xp.int32))
        if fmt.bits <= 4:
            codes = xp.empty(2 * code_bytes.size, dtype=xp.uint8)
            codes[0::2], codes[1::2] = code_bytes & 0xF, code_bytes >> 4
        else:
            codes = code_bytes.view(fmt.code_dtype)
        values = decode(codes[:hi - lo], fmt, str(xp.dtype(dtype)))         # (hi - lo,)
        start, parts = 0, []
        for size, k in zip(sizes, exponents.tolist()):   # the part of each tensor in lo:hi
            a, b = max(start, lo), min(start + size, hi)
            if a < b:
                parts.append(xp.ldexp(values[a - lo:b - lo], k))
            start += size
        mine = xp.concatenate(parts) if parts else values
        total = mine if total is None else total + mine
    return total / gathered.shape[0]
