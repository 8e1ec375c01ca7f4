"""minidist.calc.gpt against Narayanan et al. 2021 (eq. 2, 3) and PaLM (appendix B)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import (flops_utilization, gpt_layer_params, gpt_params,
                           mfu_from_throughput, palm_model_flops_per_token,
                           training_flops_per_iteration)

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)

GPT3 = dict(layers=96, hidden=12288, vocab=51200, seq=2048)


def test_eq_2_gpt3_has_174_6_billion_parameters():
    l, h, v, s = GPT3["layers"], GPT3["hidden"], GPT3["vocab"], GPT3["seq"]
    p = gpt_params(**GPT3)
    assert p / 1e9 == pytest.approx(174.6, abs=0.05)
    assert p == pytest.approx(12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h)),
                              rel=1e-12)
    assert p == l * gpt_layer_params(h) + (v + s) * h


def test_eq_3_gpt3_iteration_with_and_without_recomputation():
    b, s, l, h, v = 1536, 2048, 96, 12288, 51200
    with_ = training_flops_per_iteration(b, s, l, h, v, recompute=True)
    without = training_flops_per_iteration(b, s, l, h, v, recompute=False)
    assert with_ == pytest.approx(96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)))
    assert with_ / 1e18 == pytest.approx(4.51, abs=0.005)
    assert without / 1e18 == pytest.approx(3.39, abs=0.005)
    # eq. 4's rule of thumb: ~8 P FLOPs per token with recomputation, ~6 P without
    p = gpt_params(**GPT3)
    assert with_ / (b * s) / p == pytest.approx(8, rel=0.05)
    assert without / (b * s) / p == pytest.approx(6, rel=0.05)


def test_eq_4_gpt3_on_1024_a100s_at_140_tflops_takes_34_days():
    # time ~ 8 T P / (n X): 300e9 tokens, n = 1024 GPUs, X = 140 TFLOP/s each
    per_token = training_flops_per_iteration(1, 2048, 96, 12288, 51200) / 2048
    days = 300e9 * per_token / (1024 * 140e12) / 86400
    assert days == pytest.approx(34, abs=1)


def test_palm_540b_mfu_is_46_2_percent():
    per_token = palm_model_flops_per_token(540.35e9, 118, 48 * 256, 2048)
    assert mfu_from_throughput(238.3e3, per_token, 6144, 275e12) == pytest.approx(0.462, abs=5e-4)


@given(b=st.integers(1, 64), s=st.integers(1, 8192), l=st.integers(1, 128),
       h=st.integers(1, 16384), v=st.integers(1, 200_000))
def test_recomputation_adds_exactly_one_forward_of_the_layers(b, s, l, h, v):
    with_ = training_flops_per_iteration(b, s, l, h, v, recompute=True)
    without = training_flops_per_iteration(b, s, l, h, v, recompute=False)
    layer_forward = 24 * b * s * l * h * h + 4 * b * s * s * l * h
    assert with_ - without == pytest.approx(layer_forward, rel=1e-9)


def test_hfu_over_mfu_is_the_recomputation_ratio():
    u = flops_utilization(1536, 2048, 96, 12288, 51200, step_seconds=10.0, gpus=1024,
                          peak_flops=312e12, recompute=True)
    ratio = (training_flops_per_iteration(1536, 2048, 96, 12288, 51200, True)
             / training_flops_per_iteration(1536, 2048, 96, 12288, 51200, False))
    assert u.hfu / u.mfu == pytest.approx(ratio)
    same = flops_utilization(8, 128, 2, 64, 65, 1.0, 1, 1e12, recompute=False)
    assert same.hfu == same.mfu


def test_bad_sizes_are_errors():
    with pytest.raises(ValueError, match="layers"):
        gpt_params(0, 64, 65, 64)
    with pytest.raises(ValueError, match="step_seconds"):
        flops_utilization(1, 1, 1, 1, 1, 0.0, 1, 1.0)
