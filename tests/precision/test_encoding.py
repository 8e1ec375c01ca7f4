"""encode / decode: every bit pattern decodes to the reference value and
re-encodes to itself (NaN as a class); encode matches the reference casts' bits."""
from __future__ import annotations

import numpy as np
import pytest

from minidist import backend
from minidist.precision import FloatFormat, decode, encode

from precision.helpers import REFERENCE, same
from precision.test_rounding_vs_reference import SWEEP


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
