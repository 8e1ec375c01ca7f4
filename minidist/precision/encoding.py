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

Two implementations, one oracle
-------------------------------
``encode_reference`` / ``decode_reference`` are the formulas above, through
frexp / ldexp on int64 fields (a dozen passes, and float64 on a backend that
flushes subnormals). ``encode`` / ``decode`` take faster paths, which the tests
check bit for bit against them (subnormals, NaN, inf, ties included):

- decode: a table of the 2^bits values, built once per format by
  ``decode_reference``, indexed by the codes (a gather keeps a subnormal's bits
  on every backend, so the table is exact where float32 arithmetic flushes);
  bfloat16 to float32 needs no table: the code shifted into a float32's top half
  (a NaN made the quiet one, as the table holds it);
- encode, bfloat16 from float32: round the bit pattern (rounding.py) and keep
  its top 16 bits; integer operations only;
- encode, a format whose values are all normal in x's dtype, or zero (fp16 and
  the 8-bit formats from float32; everything but E8M0 from float64): the code
  straight from x's bit pattern, rounding included (s = p - M dropped bits; p,
  B_x: x's mantissa bits and bias): for |x| >= 2^emin

      code = ((a + 2^(s-1) - 1 + bit_s(a)) >> s) - ((B_x - B) << M)    (a = bits(|x|))

  (nearest even on the pattern, a carry bumping the exponent field, which is then
  rebiased), below it ``bits(|x| + C) - bits(C)`` with C = 2^(emin - M + p): the
  floats next to C lie 2^(emin - M) apart, the subnormal gap, so the hardware's
  addition rounds |x| to nearest even and the difference of the patterns counts
  the gaps, the subnormal's mantissa (2^M, the smallest normal's code, where it
  rounds up). Then overflow (past max's code: max, inf or NaN as ``quantize``
  gives them), NaN and the sign. One pass, a cache-sized block at a time.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.backend.blocks import blockwise
from minidist.precision.formats import FloatFormat, get_format
from minidist.precision.rounding import LAYOUT, quantize, quiet
from minidist.precision.subnormals import narrow, widen


def encode(x: Any, fmt: FloatFormat | str, saturate: bool = False) -> Any:
    """Codes of ``quantize(x, fmt, saturate=saturate)``, as ``fmt.code_dtype``
    (bit for bit ``encode_reference``, faster: module docstring)."""
    fmt = get_format(fmt)
    dtype = str(x.dtype)
    if dtype == "float32" and _is_bf16(fmt):
        return _encode_bf16_bits(x, saturate)
    flushed = (dtype == "float32" and fmt.smallest_subnormal < 2.0 ** -125
               and backend.flushes_subnormals())     # |x| + C would lose x's subnormals
    if dtype in LAYOUT and _all_normal_in(fmt, dtype) and not flushed:
        return _encode_bits(x, fmt, saturate)
    return encode_reference(x, fmt, saturate)


def decode(codes: Any, fmt: FloatFormat | str, dtype: str = "float32") -> Any:
    """Values of the codes, as ``dtype`` (float32 or float64; exact either way): a
    lookup in the table of every code's value (bit for bit ``decode_reference``)."""
    fmt = get_format(fmt)
    _check_codes(codes, fmt, dtype)
    if fmt.bits > 16:                            # no table of 2^bits values
        return decode_reference(codes, fmt, dtype)
    if dtype == "float32" and _is_bf16(fmt):     # a bfloat16 code is a float32's top half
        return _decode_bf16_bits(codes)
    return xp.take(_table(fmt, dtype), codes.astype(xp.intp, copy=False))


def encode_reference(x: Any, fmt: FloatFormat | str, saturate: bool = False) -> Any:
    """``encode`` by the plain formula (frexp / ldexp on int64 fields): the oracle."""
    fmt = get_format(fmt)
    M, E = fmt.man_bits, fmt.exp_bits
    if str(x.dtype) == "float32" and backend.flushes_subnormals():
        x = widen(x)                             # frexp / ldexp below would lose subnormals
    y = quantize(x, fmt, saturate=saturate)
    _refuse_nan(fmt, xp.isnan(y))
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


def decode_reference(codes: Any, fmt: FloatFormat | str, dtype: str = "float32") -> Any:
    """``decode`` by the plain formula (ldexp of the fields): the oracle."""
    fmt = get_format(fmt)
    M, E = fmt.man_bits, fmt.exp_bits
    _check_codes(codes, fmt, dtype)
    if dtype == "float32" and backend.flushes_subnormals():
        return narrow(decode_reference(codes, fmt, "float64"))   # ldexp in float32 would flush
    c = codes.astype(xp.int64)
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


def _refuse_nan(fmt: FloatFormat, nan: Any) -> None:
    if not fmt.has_nan and bool(nan.any()):
        raise ValueError(f"{fmt.name} has no NaN and x holds one; replace NaN before encoding "
                         "(MX block scaling marks a block holding NaN with a NaN scale)")


def _check_codes(codes: Any, fmt: FloatFormat, dtype: str) -> None:
    if codes.dtype.kind not in "ui":
        raise TypeError(f"decode takes integer codes, got {codes.dtype}")
    if dtype not in ("float32", "float64") or not fmt.fits_in(dtype):
        raise ValueError(f"decode to {dtype!r}: use float32 or float64 wide enough for {fmt}")
    holds_only_codes = codes.dtype.kind == "u" and 8 * codes.dtype.itemsize <= fmt.bits
    if codes.size and not holds_only_codes:      # uint8 codes of an 8-bit format need no look
        c = codes.astype(xp.int64)
        if int(c.min()) < 0 or int(c.max()) >= 2 ** fmt.bits:
            raise ValueError(f"codes must lie in [0, 2^{fmt.bits}) for {fmt}")


_TABLES: dict = {}   # (format, dtype, backend, device) -> every code's value, in code order


def _table(fmt: FloatFormat, dtype: str) -> Any:
    """``decode_reference`` of 0 .. 2^bits - 1 (at most 65536 values), made once."""
    key = (fmt, dtype, backend.get_backend(), backend.current_device())
    if key not in _TABLES:
        every = xp.arange(2 ** fmt.bits, dtype=xp.int64).astype(fmt.code_dtype)
        _TABLES[key] = decode_reference(every, fmt, dtype)
    return _TABLES[key]


def _is_bf16(fmt: FloatFormat) -> bool:
    """float32's sign, exponent and top 7 mantissa bits: a code is a float32's top half."""
    return (fmt.special == "ieee" and fmt.exp_bits == 8 and fmt.man_bits == 7
            and fmt.bias == 127)


def _encode_bf16_bits(x: Any, saturate: bool) -> Any:
    """bfloat16 codes of float32 x: the bit pattern rounded to nearest even (rounding.py's
    ``_round_bf16_like``), its top 16 bits; a NaN is the quiet 0x7FC0 with x's sign;
    ``saturate``: a code at or above inf's (0x7F80), NaN aside, is the largest finite.
    One pass, a cache-sized block at a time."""
    U = xp.uint32

    def codes(b: Any) -> Any:
        u = backend.bits(b)
        t = u >> U(16)
        t &= U(1)
        t += U(0x7FFF)
        t += u                                   # carries into bit 16 when rounding up
        t >>= U(16)
        xp.copyto(t, U(0x7FC0), where=(u & U(0x7FFFFFFF)) > U(0x7F800000))   # NaN
        if saturate:                             # overflowed, or x was inf
            xp.copyto(t, U(0x7F7F), where=(t & U(0x7FFF)) == U(0x7F80))
        sign = u >> U(16)
        sign &= U(0x8000)
        t |= sign                                # (the rounded codes hold it already)
        return t.astype(xp.uint16)

    return blockwise(codes, x, xp.uint16)


def _decode_bf16_bits(codes: Any) -> Any:
    """float32 values of bfloat16 codes: each code shifted into a float32's top half; a
    NaN is the quiet 0x7FC00000 with the code's sign, as ``decode_reference`` gives it."""
    U = xp.uint32
    u = codes.astype(U) << U(16)
    nan = (u & U(0x7FFFFFFF)) > U(0x7F800000)
    if bool(nan.any()):                          # (rare: one pass more only then)
        u = xp.where(nan, (u & U(0x80000000)) | U(0x7FC00000), u)
    return backend.from_bits(u, "float32")


def _all_normal_in(fmt: FloatFormat, dtype: str) -> bool:
    """Every value of fmt but 0 is a normal float of ``dtype``, so y's bits give its code
    (E8M0, exponent only, is left to the reference)."""
    p, ebias, _ = LAYOUT[dtype]
    return (fmt.special != "fnu" and fmt.bits <= 16 and fmt.fits_in(dtype)
            and fmt.smallest_subnormal >= 2.0 ** (1 - ebias))


def _encode_bits(x: Any, fmt: FloatFormat, saturate: bool) -> Any:
    """The codes of ``quantize(x, fmt, saturate=saturate)`` from x's bit pattern, for a
    format whose values are all normal in x's dtype (module docstring)."""
    M, E = fmt.man_bits, fmt.exp_bits
    dtype = str(x.dtype)
    p, ebias, uint = LAYOUT[dtype]
    U = getattr(xp, uint)
    s = p - M                                    # mantissa bits dropped
    width = 8 * x.itemsize
    top = (2 ** E - 1) << M                      # the all-ones exponent field
    max_code = {"ieee": top - 1, "fn": top | (2 ** M - 2)}.get(fmt.special, 2 ** (E + M) - 1)
    nan_code = None                              # "finite": no NaN
    if fmt.special == "ieee":
        nan_code = top | 2 ** (M - 1)            # the quiet NaN
    elif fmt.special == "fn":
        nan_code = top | (2 ** M - 1)
    elif fmt.special == "fnuz":
        nan_code = 2 ** (E + M)                  # -0's pattern
    over_code = max_code if saturate or nan_code is None else (
        top if fmt.special == "ieee" else nan_code)              # inf, or NaN
    if nan_code is None:
        _refuse_nan(fmt, xp.isnan(x))
    smallest_normal = U((fmt.emin + ebias) << p)                 # 2^emin's bits in x's dtype
    c_bits = U((fmt.emin - M + p + ebias) << p)                  # C: its spacing, the gap
    c = backend.from_bits(xp.asarray([c_bits], dtype=U), dtype)[0]

    def codes(b: Any) -> Any:
        u = backend.bits(b)
        a = u & U(2 ** (width - 1) - 1)                          # |x|'s bits
        code = a >> U(s)
        code &= U(1)
        code += U(2 ** (s - 1) - 1)
        code += a                                # carries into bit s when rounding up
        code >>= U(s)
        code -= U((ebias - fmt.bias) << M)       # rebiased (wraps below 2^emin: replaced)
        with quiet():                            # inf + C, NaN + C: replaced below
            sub = backend.bits(backend.from_bits(a, dtype) + c)  # rounded to the gap's grid
        sub -= c_bits
        xp.copyto(code, sub, where=a < smallest_normal)
        xp.copyto(code, U(over_code), where=code > U(max_code))  # inf too
        if nan_code is not None and nan_code != over_code:
            xp.copyto(code, U(nan_code), where=a > U((2 * ebias + 1) << p))  # inf's bits
        negative = u >> U(width - 1)
        if fmt.special == "fnuz":                # no -0; the NaN (-0's pattern) has no sign
            negative &= (code != 0) & (code != U(nan_code))
        negative <<= U(E + M)
        code |= negative
        return code.astype(fmt.code_dtype)

    return blockwise(codes, x, fmt.code_dtype)
