"""minidist.calc.precision against the worked numbers of the source documents.

"workbook X.Y" is the workbook's exercise X.Y (004_*.txt), "quiz QN" the chapter
26 quiz (002_*.txt).
"""
import struct

import pytest

from minidist.calc import dynamic_loss_scale, format_max, format_min_normal, format_min_subnormal

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_workbook_ex_8_1_fp16_smallest_normal():
    assert format_min_normal(5) == 2.0**-14
    assert format_min_normal(5) == pytest.approx(6.1035e-5, abs=5e-10)


def test_quiz_q11_fp16_and_bf16_ranges():
    assert format_min_subnormal(5, 10) == pytest.approx(5.96e-8, abs=5e-11)
    assert format_max(5, 10) == 65504
    assert format_max(8, 7) == pytest.approx(3.4e38, rel=5e-3)


def test_workbook_ch8_fp8_e4m3_and_e5m2_max():
    assert format_max(4, 3, finite_only=True) == 448
    assert format_max(5, 2) == 57344


def test_fp32_max_matches_the_ieee_bits():
    largest = struct.unpack(">f", bytes.fromhex("7f7fffff"))[0]
    assert format_max(8, 23) == largest
    assert format_min_normal(8) == struct.unpack(">f", bytes.fromhex("00800000"))[0]


def test_workbook_ex_8_2_loss_scale_trace():
    overflows = [False, True, False, True, False]
    assert dynamic_loss_scale(overflows, init_scale=2.0**16, growth_interval=2000) == 16384


def test_workbook_ex_8_6_scale_doubles_after_growth_interval_good_steps():
    assert dynamic_loss_scale([False] * 4, init_scale=8.0, growth_interval=2) == 32.0
    assert dynamic_loss_scale([False, True, False], init_scale=8.0, growth_interval=2) == 4.0


def test_block_format_bits_worked_numbers():
    from minidist.calc import block_format_bits
    assert block_format_bits("mxfp8") == 8.25 and block_format_bits("mxfp4") == 4.25
    assert block_format_bits("nvfp4") == 4.5 and block_format_bits("nvfp4", 1024) == 4.5 + 1 / 32
    assert block_format_bits("fp8_blockwise_tile") == 8.25
    assert block_format_bits("fp8_blockwise_block") == 8 + 32 / 16384
    with pytest.raises(ValueError, match="unknown block format"):
        block_format_bits("mxfp3")
