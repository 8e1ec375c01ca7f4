"""``quantize``: round float32 / float64 values to a low-precision format, exactly.

The result has the input's dtype, but every value is one the format can hold
(the format is *emulated*). Rounding is done once, from the exact input.

Round to nearest, ties to even
------------------------------
Let ``E = max(floor(log2 |x|), emin)`` be the binade of x (subnormals share the
lowest one) and ``q = 2^(E - M)`` its gap. Then

    quantize(x) = sign(x) * rint(|x| / q) * q        (rint: ties to the even integer)

Worked example, bf16 (M = 7), x = 1 + 2^-8 + 2^-30 (a float64):
E = 0, q = 2^-7, |x| / q = 128.5 + 2^-23, rint -> 129, result 129 * 2^-7 = 1.0078125.
Going through float32 first would round x to 1 + 2^-8 (the 2^-30 is lost), an
exact tie 128.5 that goes to the even 128: 1.0, the wrong answer.

Overflow: a result above ``fmt.max`` becomes inf ("ieee" formats) or NaN ("fn",
"fnuz"), or +-max with ``saturate=True`` (inf too; NaN stays NaN). "fnuz"
formats have no -0: a negative value that rounds to zero gives +0. "finite"
formats (FP6, FP4) always saturate, inf included, as the OCP MX spec says; they
have no NaN, and a NaN input stays NaN here (ml_dtypes writes -0's pattern).

Exponent-only "fnu" formats (E8M0) hold 2^e for emin <= e <= emax and NaN:
with x = f * 2^e, 1 <= f < 2, the result is 2^e for f < 1.5 and 2^(e+1) from
1.5 up (ties up, as ml_dtypes rounds); below 2^emin it is 2^emin (there is no
zero); zero, negative, inf and NaN inputs give NaN, and so does a result above
2^emax unless ``saturate`` (then 2^emax). Stochastic: up with probability f - 1.

Stochastic rounding: with ``lo <= |x| < lo + q`` the neighbours, |x| goes to
``lo + q`` with probability ``(|x| - lo) / q`` and to ``lo`` otherwise, so
E[quantize(x)] = x. (The uniform draw is a float64, so the probability is exact
to 2^-53.) The draw comes from ``rng``, a ``backend.Generator``.

Two implementations, one oracle
-------------------------------
``quantize_reference`` is the formula above with frexp / ldexp / rint: scaling
by a power of two is exact (the scaled value stays a normal float), and rint is
IEEE round-half-even. ``quantize`` takes a faster path where it can, which the
tests check bit for bit against the reference and against ml_dtypes / NumPy:

- "magic number": with ``C = 2^(E + p)`` (p = 23 for float32, 52 for float64),
  |x| + C lies in [C, 2C) where the float spacing is exactly q, so the
  hardware's round-to-nearest-even addition performs our rounding, and
  ``(|x| + C) - C`` is exact. A few integer ops build C from the bits of x.
- bfloat16-like formats (float32's exponent range) on float32: round the bit
  pattern itself: add ``0x7FFF + (bit 16)``, clear the low 16 bits.

On a backend that flushes float32 subnormals (CuPy), float32 input whose format
reaches below 2^-125 is rounded in float64 and narrowed back through its bits
(subnormals.py); the bf16 bit-pattern path needs no float arithmetic and stays.

Both are chains of a dozen elementwise steps, run one cache-sized block at a time
(backend/blocks.py): twice the speed of whole-array sweeps on 10M values.
"""
from __future__ import annotations

import contextlib
from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.backend.blocks import blockwise
from minidist.precision.formats import FloatFormat, get_format
from minidist.precision.subnormals import narrow, widen

# per input dtype: (mantissa bits p, exponent bias, uint view)
LAYOUT = {"float32": (23, 127, "uint32"), "float64": (52, 1023, "uint64")}


def quantize(x: Any, fmt: FloatFormat | str, rounding: str = "nearest",
             saturate: bool = False, rng: backend.Generator | None = None) -> Any:
    """Round each value of ``x`` to ``fmt``; returns a new array of x's dtype.

    ``rounding="nearest"``: round to nearest, ties to even. ``"stochastic"``:
    round up (away from zero) with probability equal to the distance to the
    lower neighbour in units of the gap, drawing from ``rng`` (default: the
    default generator). ``saturate=True``: overflow to +-fmt.max instead of
    inf / NaN.

        >>> quantize(from_host(np.array([1.0009765625, 70000.0, 3e-8], "float32")), "fp16")
        array([1.0009766e+00,           inf, 5.9604645e-08], dtype=float32)
    """
    fmt = get_format(fmt)
    dtype = _check_input(x, fmt)
    if _flushed(fmt, dtype) and not (rounding == "nearest" and not saturate
                                     and _bit_pattern_applies(fmt, dtype)):
        return narrow(quantize(widen(x), fmt, rounding, saturate, rng))   # exact: see subnormals.py
    with quiet():
        if rounding == "nearest" and rng is None:
            # elementwise: one cache-sized block at a time (backend/blocks.py)
            return blockwise(lambda b: _quantize(b, fmt, dtype, "nearest", saturate, None), x)
        return _quantize(x, fmt, dtype, rounding, saturate, rng)


def _quantize(x: Any, fmt: FloatFormat, dtype: str, rounding: str, saturate: bool,
              rng: backend.Generator | None) -> Any:
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if fmt.special == "fnu":
        u = None
        if rounding == "stochastic":
            u = (rng or backend.default_generator()).random(x.shape, dtype="float64")
        elif rng is not None:
            raise ValueError("rng is only used with rounding='stochastic'")
        return _round_exponent_only(x, fmt, saturate, u)
    if rounding == "stochastic":
        u = (rng or backend.default_generator()).random(x.shape, dtype="float64")
        return _finish(_round_magnitude_reference(x, fmt, u), x, fmt, saturate)
    if rounding != "nearest":
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    if rng is not None:
        raise ValueError("rng is only used with rounding='stochastic'")
    if _magic_applies(fmt, dtype):
        return _finish(_round_magnitude_magic(x, fmt, dtype), x, fmt, saturate)
    if _bit_pattern_applies(fmt, dtype):
        return _round_bf16_like(x, fmt, saturate)
    return _finish(_round_magnitude_reference(x, fmt), x, fmt, saturate)


def quantize_reference(x: Any, fmt: FloatFormat | str, saturate: bool = False) -> Any:
    """Round to nearest even by the plain formula (frexp / ldexp / rint): the oracle."""
    fmt = get_format(fmt)
    if _flushed(fmt, _check_input(x, fmt)):
        return narrow(quantize_reference(widen(x), fmt, saturate))
    with quiet():
        if fmt.special == "fnu":
            return _round_exponent_only(x, fmt, saturate)
        return _finish(_round_magnitude_reference(x, fmt), x, fmt, saturate)


def quiet() -> Any:
    """Silence NumPy's overflow / invalid warnings: inf and NaN are expected inputs here."""
    errstate = getattr(xp, "errstate", None)     # CuPy has none (and does not warn)
    return errstate(all="ignore") if errstate is not None else contextlib.nullcontext()


def _flushed(fmt: FloatFormat, dtype: str) -> bool:
    """Whether float32 arithmetic here would lose values of ``fmt``: a backend that
    flushes subnormals (CuPy) and a format with values below 2^-126 (bf16, E8M0), or
    inputs there that do not all round to 0 (smallest value below 2^-125)."""
    return (dtype == "float32" and fmt.smallest_subnormal < 2.0 ** -125
            and backend.flushes_subnormals())


def _check_input(x: Any, fmt: FloatFormat) -> str:
    if not backend.is_array(x):
        raise TypeError(f"quantize takes an array of the active backend "
                        f"({backend.get_backend()}), got {type(x).__name__}; "
                        "use backend.from_host(...)")
    dtype = str(x.dtype)
    if dtype not in LAYOUT:
        raise TypeError(f"quantize takes float32 or float64 input, got {dtype}")
    if not fmt.fits_in(dtype):
        raise ValueError(f"{fmt.name} (E{fmt.exp_bits}M{fmt.man_bits}, bias {fmt.bias}) has "
                         f"values that {dtype} cannot hold exactly; use wider input")
    return dtype


# -- the three ways to round |x| ------------------------------------------------

def _round_magnitude_reference(x: Any, fmt: FloatFormat, u: Any = None) -> Any:
    """|x| rounded to the grid of its binade (rint, or stochastic with uniforms u)."""
    mag = xp.abs(x)
    _, k = xp.frexp(mag)                        # mag = f * 2^k, f in [0.5, 1)
    e = xp.maximum(k - 1, fmt.emin)             # binade exponent E; subnormals share emin
    scaled = xp.ldexp(mag, fmt.man_bits - e)    # |x| / q: exact, lands in [0, 2^(M+1))
    if u is None:
        xp.rint(scaled, out=scaled)             # IEEE round half to even
    else:
        low = xp.floor(scaled)
        scaled = low + (u < (scaled - low))     # up with probability = fraction
        scaled = scaled.astype(x.dtype, copy=False)
    return xp.ldexp(scaled, e - fmt.man_bits)


def _magic_applies(fmt: FloatFormat, dtype: str) -> bool:
    p, ebias, _ = LAYOUT[dtype]
    return (fmt.man_bits < p                            # C = 2^(E + p) has q as its spacing
            and fmt.emin + ebias >= 1                   # subnormal x sits in emin's binade
            and fmt.emax + ebias + p - fmt.man_bits <= 2 * ebias)  # C stays finite


def _round_magnitude_magic(x: Any, fmt: FloatFormat, dtype: str) -> Any:
    """|x| rounded by the hardware: (|x| + C) - C with C = 2^(E + p - M)."""
    p, ebias, uint = LAYOUT[dtype]
    U = getattr(xp, uint)
    a = backend.bits(x) & U(2 ** (8 * x.itemsize - 1) - 1)   # |x| as bits (a new array)
    c = a >> U(p)                                   # biased exponent field of x
    xp.maximum(c, U(fmt.emin + ebias), out=c)       # subnormals of fmt share emin's gap
    xp.minimum(c, U(fmt.emax + ebias), out=c)       # above emax all overflows; keep C finite
    c += U(p - fmt.man_bits)                        # exponent of C = E + p - M ...
    c <<= U(p)                                      # ... as a float's bits
    mag = backend.from_bits(a, dtype)
    c = backend.from_bits(c, dtype)
    mag += c                                        # rounds to a multiple of 2^(E - M), ties even
    mag -= c                                        # exact (both in [C, 2C])
    return mag


def _bit_pattern_applies(fmt: FloatFormat, dtype: str) -> bool:
    return (dtype == "float32" and fmt.special == "ieee" and fmt.man_bits < 23
            and fmt.emin == -126 and fmt.emax == 127)


def _round_bf16_like(x: Any, fmt: FloatFormat, saturate: bool) -> Any:
    """Round the float32 bit pattern: keep the top 9 + M bits, nearest even.

    Adding ``2^(s-1) - 1 + (bit s)`` to the pattern (s = 23 - M dropped bits)
    carries into bit s exactly when the dropped part is above half, or is half
    and bit s is odd; a carry out of the mantissa bumps the exponent, and past
    the largest finite value lands on inf's pattern, as IEEE rounding does.
    """
    s = 23 - fmt.man_bits
    u = backend.bits(x)
    U = xp.uint32
    t = u >> U(s)
    t &= U(1)
    t += U(2 ** (s - 1) - 1)
    t += u
    t &= U((2 ** 32 - 1) ^ (2 ** s - 1))        # clear the dropped bits
    y = backend.from_bits(t, "float32")
    nan = xp.isnan(x)                           # a NaN's payload may have carried away
    y[nan] = x[nan]
    if saturate:
        xp.minimum(y, fmt.max, out=y)
        xp.maximum(y, -fmt.max, out=y)
    return y


def _round_exponent_only(x: Any, fmt: FloatFormat, saturate: bool, u: Any = None) -> Any:
    """x rounded to a power of two 2^emin .. 2^emax ("fnu" formats); NaN where none fits."""
    f, k = xp.frexp(x)                          # x = f * 2^k, f in [0.5, 1) for x > 0
    if u is None:
        up = f >= 0.75                          # 2f >= 1.5: ties go up
    else:
        up = u < (2 * f - 1)                    # up with probability 2f - 1
    e = xp.maximum(k - 1 + up, fmt.emin)        # no zero, no subnormals: 2^emin is the floor
    y = xp.ldexp(xp.ones_like(x), e.astype(xp.int32))
    if saturate:
        xp.minimum(y, fmt.max, out=y)
    y[~(x > 0) | (y > fmt.max)] = xp.nan        # zero, negative, NaN; overflow
    y[x == xp.inf] = fmt.max if saturate else xp.nan
    return y


def _finish(mag: Any, x: Any, fmt: FloatFormat, saturate: bool) -> Any:
    """Overflow, then x's sign, onto a rounded magnitude (modified in place)."""
    if saturate or fmt.special == "finite":
        xp.minimum(mag, fmt.max, out=mag)       # NaN stays NaN
    else:
        mag[mag > fmt.max] = xp.inf if fmt.has_inf else xp.nan
    xp.copysign(mag, x, out=mag)
    if not fmt.has_negative_zero:
        mag += 0.0                              # -0 + 0 = +0 in round-to-nearest
    return mag
