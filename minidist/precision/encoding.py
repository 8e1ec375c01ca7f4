"""Raw bit patterns: ``encode`` values to a format's codes, ``decode`` them back.

A code packs ``sign | exponent field | mantissa field`` into ``fmt.bits`` bits
(held in uint8 / uint16, see ``FloatFormat.code_dtype``):

    decode:  field e >= 1:  (-1)^s * (2^M + m) * 2^(e - B - M)
             field e == 0:  (-1)^s *        m  * 2^(1 - B - M)
    encode:  the inverse, after rounding with ``quantize``.

Specials: "ieee" all-ones exponent = inf (m = 0) / NaN (encode writes the
quiet NaN, top mantissa bit set: fp16 0x7E00, bf16 0x7FC0, e5m2 0x7E);
"fn" all-ones exponent and mantissa = NaN (e4m3fn 0x7F / 0xFF);
"fnuz" 0x80..0 (the -0 pattern) = NaN; "finite" (FP6, FP4) has no specials,
and encode refuses a NaN; "fnu" (E8M0) has no sign bit: the code is the
biased exponent e + B, and all ones (0xFF) is NaN.

    >>> encode(from_host(np.array([1.0, -448.0, 2.0**-9], "float32")), "e4m3fn")
    array([ 56, 254,   1], dtype=uint8)
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.precision.formats import FloatFormat, get_format
from minidist.precision.rounding import quantize, quiet
from minidist.precision.subnormals import narrow, widen


def encode(x: Any, fmt: FloatFormat | str, saturate: bool = False) -> Any:
    """Codes of ``quantize(x, fmt, saturate=saturate)``, as ``fmt.code_dtype``."""
    fmt = get_format(fmt)
    M, E = fmt.man_bits, fmt.exp_bits
    if str(x.dtype) == "float32" and backend.flushes_subnormals():
        x = widen(x)                             # frexp / ldexp below would lose subnormals
    y = quantize(x, fmt, saturate=saturate)
    if not fmt.has_nan and bool(xp.isnan(y).any()):
        raise ValueError(f"{fmt.name} has no NaN and x holds one; replace NaN before encoding "
                         "(MX block scaling marks a block holding NaN with a NaN scale)")
    mag = xp.abs(y)                              # a new array: zeroing specials is safe
    finite = xp.isfinite(mag)
    mag[~finite] = 0                            # specials get their codes below
    _, k = xp.frexp(mag)
    e = xp.maximum(k - 1, fmt.emin)             # binade exponent; subnormals share emin
    sig = xp.ldexp(mag, M - e).astype(xp.int64)  # exact integer in [0, 2^(M+1))
    normal = sig >= 2 ** M
    field = xp.where(normal, e + fmt.bias, 0)   # 0 marks a subnormal (or zero)
    code = (field.astype(xp.int64) << M) | (sig - normal * 2 ** M)
    top = (2 ** E - 1) << M                     # the all-ones exponent field
    if fmt.special == "ieee":
        code[xp.isinf(y)] = top
        code[xp.isnan(y)] = top | 2 ** (M - 1)  # quiet NaN
    elif fmt.special == "fn":
        code[xp.isnan(y)] = top | (2 ** M - 1)
    code[xp.signbit(y)] |= 2 ** (E + M)
    if fmt.special == "fnuz":
        code[xp.isnan(y)] = 2 ** (E + M)        # no sign: the NaN is the -0 pattern
    if fmt.special == "fnu":                    # exponent only: e + B, NaN all ones
        code = xp.where(xp.isnan(y), 2 ** E - 1, k - 1 + fmt.bias)
    return code.astype(fmt.code_dtype)


def decode(codes: Any, fmt: FloatFormat | str, dtype: str = "float32") -> Any:
    """Values of the codes, as ``dtype`` (float32 or float64; exact either way)."""
    fmt = get_format(fmt)
    M, E = fmt.man_bits, fmt.exp_bits
    if codes.dtype.kind not in "ui":
        raise TypeError(f"decode takes integer codes, got {codes.dtype}")
    if dtype not in ("float32", "float64") or not fmt.fits_in(dtype):
        raise ValueError(f"decode to {dtype!r}: use float32 or float64 wide enough for {fmt}")
    if dtype == "float32" and backend.flushes_subnormals():
        return narrow(decode(codes, fmt, "float64"))   # ldexp in float32 would flush
    c = codes.astype(xp.int64)
    if c.size and (int(c.min()) < 0 or int(c.max()) >= 2 ** fmt.bits):
        raise ValueError(f"codes must lie in [0, 2^{fmt.bits}) for {fmt}")
    if fmt.special == "fnu":                    # exponent only, no sign
        with quiet():                            # 0xFF's 2^128 overflows: it is NaN below
            val = xp.ldexp(xp.ones(c.shape, dtype), (c - fmt.bias).astype(xp.int32))
        val[c == 2 ** E - 1] = xp.nan
        return val
    sign = (c >> (E + M)) & 1
    field = (c >> M) & (2 ** E - 1)
    mant = c & (2 ** M - 1)
    sig = mant + (field > 0) * 2 ** M           # implicit leading 1 for normals
    exp = xp.maximum(field, 1) - fmt.bias - M
    with quiet():                                # the all-ones field may overflow here
        val = xp.ldexp(sig.astype(dtype), exp.astype(xp.int32))
    if fmt.special == "ieee":
        top = field == 2 ** E - 1
        val[top & (mant == 0)] = xp.inf
        val[top & (mant != 0)] = xp.nan
    elif fmt.special == "fn":
        val[(field == 2 ** E - 1) & (mant == 2 ** M - 1)] = xp.nan
    elif fmt.special == "fnuz":
        val[c == 2 ** (E + M)] = xp.nan
    return xp.where(sign == 1, -val, val)
