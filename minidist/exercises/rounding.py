"""35.18 bf16 and fp16 rounding, to the bit, against minidist.precision.quantize."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property

# float32 values, with ties (the 16 low bits exactly 0x8000) and their neighbours
f32_bits = st.one_of(
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**16 - 1).map(lambda hi: (hi << 16) | 0x8000),
    st.integers(0, 2**16 - 1).map(lambda hi: (hi << 16) | 0x7FFF),
)
f32_arrays = st.lists(f32_bits, min_size=1, max_size=6).map(
    lambda b: np.array(b, dtype=np.uint32).view(np.float32))
f64_arrays = st.lists(st.floats(-1e5, 1e5, allow_nan=False) | st.sampled_from(
    [1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65520.0, 2**-24, 2**-25, 3 * 2**-26]),
    min_size=1, max_size=6).map(np.array)


def library_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """minidist.precision.quantize on a host array, whatever the active backend."""
    from minidist.backend import from_host, to_host
    from minidist.precision.rounding import quantize
    return to_host(quantize(from_host(x), fmt))


def _same_bits(got, want, x, what):
    got = np.asarray(got, dtype=want.dtype)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert got.shape == want.shape and same.all(), \
        f"{what}: x = {x.tolist()} -> {got.tolist()}, expected {want.tolist()}"


def _theirs(fn, x: np.ndarray) -> np.ndarray:
    """The subject's function on an array of the active backend, back on the host."""
    from minidist.backend import from_host, to_host
    return to_host(fn(from_host(x.copy())))


def _bf16_nearest_even(s, x):
    _same_bits(_theirs(s.round_to_bf16, x), library_round(x, "bf16"), x, "round_to_bf16")


def _bf16_low_bits_zero(s, x):
    got = np.asarray(_theirs(s.round_to_bf16, x), dtype=np.float32)
    finite = np.isfinite(got)
    low = got[finite].view(np.uint32) & 0xFFFF
    assert not low.any(), f"round_to_bf16({x.tolist()}) = {got.tolist()} keeps bits below bf16's 7"


def _fp16_nearest_even(s, x):
    _same_bits(_theirs(s.round_to_fp16, x), library_round(x, "fp16"), x, "round_to_fp16")


ROUNDING = Exercise(
    id="35.18", title="bf16 and fp16 rounding, to the bit", kind="implement",
    filename="ex_35_18_rounding.py",
    docs="docs/precision.md (formats, rounding)",
    starter='''"""Exercise 35.18 (BFloat16 vs Float16): round to each format, to the bit.

round_to_bf16(x): x is float32; return float32 values that bf16 can hold
(8 exponent bits, 7 mantissa bits: the upper 16 bits of a float32), rounded
to nearest, ties to even. On the bits u = x.view(uint32):

    keep the upper 16 bits; add 0x7FFF + (bit 16 of u) before cutting,
    so that 0x8000 exactly (a tie) rounds to the even neighbour.
    NaN stays NaN (the add could turn it into inf).

round_to_fp16(x): x is float64; return float64 values that fp16 can hold
(5 exponent bits, 10 mantissa bits: max 65504, subnormals down to 2^-24),
rounded to nearest, ties to even, overflow to inf. Any method is fine here;
compare what you get with bf16 on the same numbers.

Interface: arrays of minidist.backend.xp (NumPy, or CuPy on a GPU); views
as on NumPy (x.view(xp.uint32)). Check: `minidist exercise check 35.18`.
"""
from minidist.backend import xp


def round_to_bf16(x):
    raise NotImplementedError


def round_to_fp16(x):
    raise NotImplementedError
''',
    properties=[
        Property("round_to_bf16 keeps only bf16's bits", _bf16_low_bits_zero,
                 dict(x=f32_arrays), examples=25, hint="mask the low 16 bits after rounding"),
        Property("round_to_bf16 rounds to nearest, ties to even, NaN stays NaN",
                 _bf16_nearest_even, dict(x=f32_arrays), examples=60,
                 hint="docs/precision.md: add 0x7FFF plus the lowest kept bit, then cut"),
        Property("round_to_fp16 rounds to nearest, ties to even, overflows to inf",
                 _fp16_nearest_even, dict(x=f64_arrays), examples=40,
                 hint="65520 is the tie between 65504 and the next step: it goes to inf"),
    ],
    solution='''from minidist.precision.rounding import quantize


def round_to_bf16(x):
    return quantize(x, "bf16")


def round_to_fp16(x):
    return quantize(x, "fp16")
''',
    wrong={
        "truncation": '''from minidist.backend import xp


def round_to_bf16(x):
    return (x.view(xp.uint32) & 0xFFFF0000).view(xp.float32)


def round_to_fp16(x):
    return x.astype(xp.float16).astype(xp.float64)
''',
        "ties away from zero": '''from minidist.backend import xp


def round_to_bf16(x):
    u = x.view(xp.uint32).astype(xp.uint64)
    out = ((u + 0x8000) & 0xFFFF0000).astype(xp.uint32).view(xp.float32)
    return xp.where(xp.isnan(x), x, out)


def round_to_fp16(x):
    return x.astype(xp.float16).astype(xp.float64)
''',
    })

EXERCISES = [ROUNDING]
