"""FloatFormat: the presets' ranges equal ml_dtypes' / NumPy's; bad specs are refused."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from minidist.precision import FP8_E4M3FN, FP8_E5M2, FP16, FloatFormat, get_format

from precision.helpers import REFERENCE


@pytest.mark.parametrize("fmt", list(REFERENCE), ids=str)
def test_range_matches_reference_finfo(fmt):
    info = np.finfo(REFERENCE[fmt]) if REFERENCE[fmt] is np.float16 else ml_dtypes.finfo(REFERENCE[fmt])
    assert fmt.max == float(info.max)
    assert fmt.smallest_normal == float(info.smallest_normal)
    assert fmt.smallest_subnormal == float(info.smallest_subnormal)
    assert fmt.bits == 8 * np.dtype(REFERENCE[fmt]).itemsize


def test_worked_numbers():
    assert (FP8_E4M3FN.max, FP8_E5M2.max, FP16.max) == (448.0, 57344.0, 65504.0)
    assert FP16.smallest_normal == 2.0 ** -14 and FP16.gap(0) == 2.0 ** -10


def test_names_and_aliases():
    assert get_format("e4m3") is FP8_E4M3FN and get_format("float16") is FP16
    assert get_format(FP16) is FP16


@pytest.mark.parametrize("kwargs", [dict(exp_bits=1, man_bits=3), dict(exp_bits=4, man_bits=-1),
                                    dict(exp_bits=4, man_bits=3, special="ocp"),
                                    dict(exp_bits=4, man_bits=0, special="fn")])
def test_bad_formats_are_refused(kwargs):
    with pytest.raises(ValueError):
        FloatFormat("bad", **kwargs)
