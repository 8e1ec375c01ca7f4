"""encode / decode: every bit pattern decodes to the reference value and
re-encodes to itself (NaN as a class); encode matches the reference casts' bits;
the fast encode / decode equal the plain-formula ones bit for bit (hypothesis-drawn
bit patterns: subnormals, NaN payloads, inf; exact ties between neighbours)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.precision import PRESETS, FloatFormat, decode, encode, get_format, quantize
from minidist.precision.encoding import decode_reference, encode_reference

from precision.helpers import REFERENCE, same
from precision.test_rounding_vs_reference import SPECIALS, SWEEP


@pytest.mark.parametrize("fmt", list(REFERENCE), ids=str)
def test_every_code_decodes_to_the_reference_and_encodes_back(fmt):
    codes = np.arange(2 ** fmt.bits).astype(fmt.code_dtype)
    values = backend.to_host(decode(backend.from_host(codes), fmt))
    with np.errstate(invalid="ignore"):
        want = codes.view(REFERENCE[fmt]).astype(np.float32)
    assert same(values, want)
    back = backend.to_host(encode(backend.from_host(values), fmt))
    assert back.dtype == codes.dtype
    nan = np.isnan(values)
    assert np.array_equal(back[~nan], codes[~nan])
    assert np.isnan(backend.to_host(decode(backend.from_host(back[nan]), fmt))).all()


@pytest.mark.parametrize("fmt", list(REFERENCE), ids=str)
def test_encode_matches_reference_cast_bits(fmt):
    x = SWEEP[::7]
    got = backend.to_host(encode(backend.from_host(x), fmt))
    with np.errstate(all="ignore"):
        want = x.astype(REFERENCE[fmt]).view(fmt.code_dtype)
    nan = np.isnan(x.astype(REFERENCE[fmt]).astype(np.float32))
    assert np.array_equal(got[~nan], want[~nan])


@pytest.mark.parametrize("fmt", [FloatFormat("e2m1", 2, 1, special="fnuz"),
                                 FloatFormat("e3m2", 3, 2), FloatFormat("e5m6fn", 5, 6, special="fn")],
                         ids=str)
def test_any_exmy_round_trips(fmt):
    codes = np.arange(2 ** fmt.bits).astype(fmt.code_dtype)
    values = decode(backend.from_host(codes), fmt, "float64")
    back = backend.to_host(encode(values, fmt))
    nan = np.isnan(backend.to_host(values))
    assert np.array_equal(back[~nan], codes[~nan])
    assert nan.sum() == {"fnuz": 1, "fn": 2, "ieee": 2 * (2 ** fmt.man_bits - 1)}[fmt.special]


def test_worked_codes():
    got = backend.to_host(encode(backend.from_host(np.array([1.0, -448.0, 2.0 ** -9], "float32")),
                                 "e4m3fn"))
    assert got.tolist() == [0x38, 0xFE, 0x01]


def test_decode_refuses_bad_codes():
    with pytest.raises(ValueError, match="codes must lie"):
        decode(backend.from_host(np.array([256], np.int32)), "e5m2")
    with pytest.raises(TypeError, match="integer codes"):
        decode(backend.from_host(np.array([1.0])), "e5m2")


# every preset of at most 16 bits, and ExMy formats no preset has
SMALL = [f for f in map(get_format, PRESETS) if f.bits <= 16] + [
    FloatFormat("e2m1", 2, 1, special="fnuz"), FloatFormat("e3m2", 3, 2),
    FloatFormat("e5m6fn", 5, 6, special="fn"), FloatFormat("e4m3b11fnuz", 4, 3, bias=11,
                                                           special="fnuz")]


def ties(fmt, codes: np.ndarray, dtype: str) -> np.ndarray:
    """Midpoints of consecutive finite values of fmt in ``dtype`` (exact: M <= 22), and
    the neighbours of each midpoint there."""
    codes = codes[codes + 1 < 2 ** fmt.bits]
    c = backend.from_host(codes.astype(fmt.code_dtype))
    lo = backend.to_host(decode_reference(c, fmt, "float64"))
    hi = backend.to_host(decode_reference(backend.from_host((codes + 1).astype(fmt.code_dtype)),
                                          fmt, "float64"))
    ok = np.isfinite(lo) & np.isfinite(hi) & (np.sign(lo) == np.sign(hi))
    mid = ((lo[ok] + hi[ok]) / 2).astype(dtype)
    return np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])


def encoded_or_error(encoder, x, fmt, saturate):
    try:
        return backend.to_host(encoder(backend.from_host(x), fmt, saturate))
    except ValueError as e:                      # a NaN for a format that has none
        return str(e)


def assert_fast_encode_is_reference(x: np.ndarray, fmt, saturate: bool) -> None:
    fast = encoded_or_error(encode, x, fmt, saturate)
    slow = encoded_or_error(encode_reference, x, fmt, saturate)
    if isinstance(slow, str) or isinstance(fast, str):
        assert fast == slow
        return
    assert fast.dtype == slow.dtype
    bad = np.flatnonzero(fast != slow)
    assert bad.size == 0, (f"x={x[bad[0]]!r} (bits {x.view(f'u{x.itemsize}')[bad[0]]:#x}): "
                           f"code {fast[bad[0]]:#x}, reference {slow[bad[0]]:#x}")


@pytest.mark.parametrize("fmt", SMALL, ids=str)
@settings(max_examples=40, deadline=None)
@given(patterns=st.lists(st.integers(0, 2 ** 32 - 1), min_size=1, max_size=200),
       codes=st.lists(st.integers(0, 2 ** 16 - 1), min_size=1, max_size=50),
       saturate=st.booleans())
def test_fast_encode_float32_equals_reference_bit_for_bit(fmt, patterns, codes, saturate):
    if not fmt.fits_in("float32"):
        return
    codes = np.array(codes) % 2 ** fmt.bits
    x = np.concatenate([np.array(patterns, dtype=np.uint32).view(np.float32),
                        ties(fmt, codes, "float32"), SPECIALS, -SPECIALS])
    assert_fast_encode_is_reference(x, fmt, saturate)


@pytest.mark.parametrize("fmt", SMALL, ids=str)
@settings(max_examples=40, deadline=None)
@given(patterns=st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=100),
       narrow=st.lists(st.integers(0, 2 ** 32 - 1), min_size=1, max_size=100),
       codes=st.lists(st.integers(0, 2 ** 16 - 1), min_size=1, max_size=50),
       saturate=st.booleans())
def test_fast_encode_float64_equals_reference_bit_for_bit(fmt, patterns, narrow, codes, saturate):
    codes = np.array(codes) % 2 ** fmt.bits
    with np.errstate(invalid="ignore"):          # NaN payloads widen quietly
        wide = np.array(narrow, dtype=np.uint32).view(np.float32).astype(np.float64)
    x = np.concatenate([np.array(patterns, dtype=np.uint64).view(np.float64), wide,
                        ties(fmt, codes, "float64"), SPECIALS.astype(np.float64),
                        -SPECIALS.astype(np.float64)])
    assert_fast_encode_is_reference(x, fmt, saturate)


@pytest.mark.parametrize("fmt", SMALL, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_decode_table_equals_reference_for_every_code(fmt, dtype):
    if not fmt.fits_in(dtype):
        return
    codes = backend.from_host(np.arange(2 ** fmt.bits).astype(fmt.code_dtype))
    fast = backend.to_host(decode(codes, fmt, dtype))
    slow = backend.to_host(decode_reference(codes, fmt, dtype))
    assert np.array_equal(fast.view(f"u{fast.itemsize}"), slow.view(f"u{slow.itemsize}"))
    wide = backend.from_host(np.arange(2 ** fmt.bits).astype(np.int32))    # other int codes
    assert np.array_equal(backend.to_host(decode(wide, fmt, dtype)).view(f"u{fast.itemsize}"),
                          fast.view(f"u{fast.itemsize}"))


@pytest.mark.parametrize("fmt", [f for f in REFERENCE if f.bits == 8], ids=str)
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1024.0, 1024.0, width=32), min_size=1, max_size=300),
       exponent=st.integers(-12, 0), saturate=st.booleans())
def test_float8_codes_of_values_in_range_equal_ml_dtypes_and_quantize(fmt, values, exponent,
                                                                        saturate):
    # FSDP's float8 gather encodes pieces scaled into [-448, 448]: normals, the format's
    # subnormals, ties and (unsaturated or not) values past its largest
    x = np.array(values, np.float32) * np.float32(2.0 ** exponent)
    codes = backend.to_host(encode(backend.from_host(x), fmt, saturate))
    y = backend.to_host(quantize(backend.from_host(x), fmt, saturate=saturate))
    assert same(backend.to_host(decode(backend.from_host(codes), fmt)), y)
    if saturate:
        x = np.clip(x, -fmt.max, fmt.max)
    with np.errstate(all="ignore"):
        want = x.astype(REFERENCE[fmt]).view(np.uint8)
    nan = np.isnan(y)                            # ml_dtypes' overflow NaN differs in sign
    assert np.array_equal(codes[~nan], want[~nan])
