"""The planner's price of each overlapped variant: each formula of overlap.py, and the
exposed time of a layout dropping by what that formula says, no more."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc import pipeline
from minidist.calc.planner import overlap, presets, time
from minidist.calc.planner.layouts import Layout

pytestmark = pytest.mark.host_only  # the planner's arithmetic: no backend array (tests/conftest.py)

H100 = presets.CLUSTERS["h100-nvlink-ib"]
SETUP = presets.TrainingSetup(global_batch_tokens=64 * 4096, seq=4096)
LLAMA = presets.MODELS["llama3-8b"]
MOE = dataclasses.replace(presets.MODELS["mixtral-8x7b"], shared_experts=1)
seconds = st.floats(0.0, 10.0)


@settings(max_examples=50, deadline=None)
@given(comm=seconds, matmul=seconds, ranks=st.integers(2, 16))
def test_collective_matmul_hides_each_transfer_behind_one_chunks_matmul(comm, matmul, ranks):
    exposed = overlap.collective_matmul_exposed(comm, matmul, ranks)
    assert exposed == pytest.approx((ranks - 1) * max(0.0, comm / (ranks - 1) - matmul / ranks))
    assert 0.0 <= exposed <= comm
    if matmul / ranks >= comm / (ranks - 1):
        assert exposed == 0.0          # every step's transfer shorter than its matmul
    # k collectives sharing T_comm and T_mm evenly leave what one of them all would
    k = 3
    split = k * overlap.collective_matmul_exposed(comm / k, matmul / k, ranks)
    assert split == pytest.approx(exposed)


@settings(max_examples=50, deadline=None)
@given(f=seconds, b=seconds, a_f=seconds, a_b=seconds)
def test_fb_pair_costs_f_plus_b_plus_what_the_other_half_cannot_hide(f, b, a_f, a_b):
    pair = overlap.fb_pair_seconds(f, b, a_f, a_b)
    assert f + b <= pair <= f + b + a_f + a_b
    assert overlap.fb_pair_seconds(f, b, min(a_f, b), min(a_b, f)) == pytest.approx(f + b)


def test_overlapped_dispatch_hides_the_forward_dispatch_up_to_the_shared_experts():
    assert overlap.overlapped_dispatch_exposed(1.0, 0.0) == 4.0
    assert overlap.overlapped_dispatch_exposed(1.0, 0.25) == 3.75
    assert overlap.overlapped_dispatch_exposed(1.0, 5.0) == 3.0


def test_gathered_dp_factor_is_1_5_at_full_width_and_falls_with_the_gathered_bytes():
    assert overlap.gathered_dp_factor(4, 4) == time.ZERO3_DP_FACTOR
    assert overlap.gathered_dp_factor(2, 4) == 1.0       # bf16 gathers, fp32 gradients
    assert overlap.gathered_dp_factor(1, 4) == 0.75      # float8


def test_async_tp_lowers_a_layouts_exposed_tp_time_by_the_collective_matmul_formula():
    layout = Layout(dp=8, tp=8, pp=1, zero=1, micro_batch=1)
    plain = time.step_time(LLAMA, SETUP, layout, H100)
    fused = overlap.overlapped_step_time(LLAMA, SETUP, layout, H100, async_tp=True)
    m = 64 // 8
    passes = LLAMA.layers * m
    want = passes * overlap.collective_matmul_exposed(plain.tp / passes, plain.compute / passes, 8)
    assert 0 < plain.tp and fused.tp == pytest.approx(want) and fused.tp < plain.tp
    assert fused.total == pytest.approx(plain.total - plain.tp + want)
    assert dataclasses.replace(fused, tp=plain.tp) == plain     # nothing else moved


def test_overlapped_dispatch_lowers_the_ep_term_by_at_most_a_quarter():
    layout = Layout(dp=8, tp=1, pp=1, ep=8, zero=1, micro_batch=1)
    plain = time.step_time(MOE, SETUP, layout, H100)
    fused = overlap.overlapped_step_time(MOE, SETUP, layout, H100, overlapped_dispatch=True)
    assert plain.ep > 0 and 0.75 * plain.ep <= fused.ep < plain.ep
    no_shared = dataclasses.replace(MOE, shared_experts=0)
    assert overlap.overlapped_step_time(no_shared, SETUP, layout, H100,
                                        overlapped_dispatch=True) == time.step_time(
        no_shared, SETUP, layout, H100)                     # nothing to hide it behind


def test_dualpipe_v_prices_its_exact_idle_and_hides_the_paired_all_to_alls():
    layout = Layout(dp=1, tp=8, pp=4, ep=1, zero=1, micro_batch=1)
    spec = dataclasses.replace(MOE, layers=32)
    plain = time.step_time(spec, SETUP, layout, H100)
    dual = overlap.overlapped_step_time(spec, SETUP, layout, H100, dualpipe_v=True)
    m, p = 64, 4
    f = plain.compute / (2 * m) / 3
    assert dual.bubble == pytest.approx(pipeline.dualpipe_v_exact_idle(p, f, 2 * f, f, 3 * f))
    assert dual.bubble < plain.bubble                     # 1F1B's (p - 1)/m of the compute
    assert dual.ep == plain.ep == 0.0                     # ep = 1: nothing to hide
    ep_layout = Layout(dp=8, tp=1, pp=4, ep=8, zero=1, micro_batch=1)
    plain = time.step_time(spec, SETUP, ep_layout, H100)
    dual = overlap.overlapped_step_time(spec, SETUP, ep_layout, H100, dualpipe_v=True)
    assert 0 <= dual.ep < plain.ep
    with pytest.raises(ValueError, match="m >= 2 pp"):
        overlap.overlapped_step_time(spec, presets.TrainingSetup(4 * 4096, 4096), layout,
                                     H100, dualpipe_v=True)


def test_low_precision_gathers_lower_zero3s_dp_term_in_step_with_the_bytes():
    layout = Layout(dp=64, tp=1, pp=1, zero=3, micro_batch=1)
    fp32 = presets.TrainingSetup(global_batch_tokens=64 * 4096, seq=4096, precision="fp32")
    plain = time.step_time(LLAMA, fp32, layout, H100)
    bf16 = overlap.overlapped_step_time(LLAMA, fp32, layout, H100, gather_bytes=2)
    fp8 = overlap.overlapped_step_time(LLAMA, fp32, layout, H100, gather_bytes=1)
    assert plain.dp > bf16.dp > fp8.dp > 0
    same = overlap.overlapped_step_time(LLAMA, fp32, layout, H100, gather_bytes=4)
    assert same.dp == pytest.approx(plain.dp)
