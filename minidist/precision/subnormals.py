"""Keep float32 subnormals where the backend flushes them (CuPy's ``-ftz=true``).

A float32 with exponent field 0 is ``(-1)^s * m * 2^-149`` (m < 2^23): bf16 codes
below 2^-126, the E8M0 scale 2^-127, GradScaler's inverse of a scale above 2^126.
CuPy's kernels read such a value as 0 and write 0 for one, in float32 arithmetic
and in float32 <-> float64 casts alike; integer operations on the bits, and all
of float64 arithmetic, are exact. So on such a backend the precision code
widens float32 to float64 through the bits, computes there, and narrows back
through the bits:

    widen(x):   exponent field 0:  sign * m * 2^-149           (a float64, exact)
                otherwise:         x.astype(float64)             (no subnormal in it)
    narrow(y):  |y| < 2^-126:      bits = sign | rint(|y| * 2^149)
                otherwise:         y.astype(float32)             (rounds to nearest even)

``rint`` is round-half-even on the subnormal grid 2^-149, so ``narrow`` rounds a
float64 to float32 exactly as an IEEE cast does (rint giving 2^23 is 2^-126, the
smallest normal: the carry lands in the exponent field). On backends that keep
subnormals (NumPy) ``widen`` / ``narrow`` are the plain casts.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.backend import xp

SMALLEST_NORMAL = 2.0 ** -126
SUBNORMAL_GAP = 2.0 ** -149


def widen(x: Any) -> Any:
    """float32 -> float64, exact, subnormals included."""
    if not backend.flushes_subnormals():
        return x.astype("float64")
    u = backend.bits(x)
    mag = (u & 0x7FFFFF).astype("float64") * SUBNORMAL_GAP
    tiny = xp.where((u >> 31) == 1, -mag, mag)
    return xp.where((u & 0x7F800000) == 0, tiny, x.astype("float64"))


def narrow(y: Any) -> Any:
    """float64 -> float32, rounded to nearest even, subnormals included."""
    if not backend.flushes_subnormals():
        return y.astype("float32")
    mag = xp.abs(y)
    tiny = mag < SMALLEST_NORMAL
    m = xp.rint(xp.where(tiny, mag, 0.0) * 2.0 ** 149).astype("uint32")  # in [0, 2^23]
    sign = xp.signbit(y).astype("uint32") << 31
    return xp.where(tiny, backend.from_bits(m | sign, "float32"), y.astype("float32"))


def exp2_float32(e: Any) -> Any:
    """2^e as float32 for integer e in [-149, 127], built from the bits (exact on
    every backend: ``ldexp`` in float32 writes 2^-127 as 0 on CuPy)."""
    e = e.astype("int64")
    normal = ((e + 127).clip(0, 254) << 23).astype("uint32")
    sub = (xp.ones(e.shape, "uint32") << (e + 149).clip(0, 22).astype("uint32"))
    return backend.from_bits(xp.where(e >= -126, normal, sub), "float32")
