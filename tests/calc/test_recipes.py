"""minidist.calc.recipes against the worked numbers of the source documents.

"workbook X.Y" is the workbook's exercise X.Y (004_*.txt), "ch26 ex N" the
chapter 26 exercises (000_*.txt).
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import (accumulation_step_seconds, accumulation_steps,
                           all_reduce_seconds_saved, checkpoint_overhead,
                           critical_batch_size, effective_batch, expected_waste_fraction,
                           failure_cost, linear_scaled_lr, lost_seconds_per_failure,
                           recompute_overhead, sqrt_scaled_lr, warmup_steps, young_interval)
from minidist.calc.units import HOUR, MINUTE, MS

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


def test_workbook_ex_2_1_accumulation_steps():
    assert accumulation_steps(2048, micro_batch=4, dp=8) == 64
    assert effective_batch(4, 64, 8) == 2048


def test_workbook_ex_2_2_communication_saved_by_accumulating():
    assert 64 * 50 == 3200                          # ms without accumulation
    assert all_reduce_seconds_saved(64, 50 * MS) / MS == pytest.approx(3150)


def test_workbook_ex_2_3_step_time_and_throughput():
    assert 64 * 120 * MS / MS == pytest.approx(7680)            # compute
    step = accumulation_step_seconds(64, 120 * MS, 50 * MS, optimizer_seconds=1 * MS)
    assert step / MS == pytest.approx(7731)
    assert 2048 / step == pytest.approx(265, abs=0.5)           # sequences per second
    assert 50 * MS / step == pytest.approx(0.006, abs=5e-4)     # "only 0.6% of the step"
    # "Without it, communication would be 3200/(64 x 120 + 3200) = 29%"
    assert 3200 / (64 * 120 + 3200) == pytest.approx(0.29, abs=0.005)


def test_workbook_ex_2_5_checkpointing_to_double_the_micro_batch_is_slower():
    plain = accumulation_steps(2048, 8, 8)
    checkpointed = accumulation_steps(2048, 16, 8)
    assert (plain, checkpointed) == (32, 16)
    t = 1.0                                          # one micro-batch of 8, no checkpointing
    slow = checkpointed * 2 * t * (1 + recompute_overhead())
    assert slow == pytest.approx(42.6, abs=0.1)      # "16 x 2.66T = 42.6T" (vs 32T)
    assert slow / (plain * t) == pytest.approx(1.33, abs=0.005)


def test_workbook_ch9_llama_405b_effective_batch():
    batch = effective_batch(micro_batch=1, accumulation_steps=4, dp=128)
    assert batch == 512
    assert batch * 8192 / 1e6 == pytest.approx(4, abs=0.2)     # "4M tokens/batch"


def test_workbook_ex_3_1_linear_lr_scaling():
    assert linear_scaled_lr(3e-4, 256, 2048) == pytest.approx(2.4e-3)


def test_workbook_ex_3_2_sqrt_lr_scaling():
    assert sqrt_scaled_lr(1.0, 256, 2048) == pytest.approx(2.828, abs=5e-4)
    assert sqrt_scaled_lr(3e-4, 256, 2048) == pytest.approx(8.49e-4, abs=5e-7)


def test_workbook_ex_3_3_warmup_steps():
    assert warmup_steps(256, 2048) == 8000
    assert warmup_steps(256, 2048) / 100_000 == pytest.approx(0.08)


def test_workbook_ex_7_3_young_interval():
    c, f = 98.0, 24 * HOUR
    assert c / HOUR == pytest.approx(0.0272, abs=5e-5)
    tau = young_interval(c, f)
    assert tau / HOUR == pytest.approx(1.143, abs=5e-4)
    assert tau / MINUTE == pytest.approx(68.5, abs=0.1)         # 68.59 (68.56 from C = 0.0272 h)
    assert tau / 10 == pytest.approx(410, abs=2)                # steps of 10 s
    assert tau / 2 / MINUTE == pytest.approx(34, abs=0.5)       # average lost work
    assert checkpoint_overhead(tau, c) == pytest.approx(0.024, abs=5e-4)


def test_workbook_ch7_checkpoint_every_1000_steps_of_10_seconds():
    interval = 1000 * 10.0
    assert interval / HOUR == pytest.approx(2.8, abs=0.05)      # "1 TB every 2.8 hours"
    assert checkpoint_overhead(interval, 98) == pytest.approx(0.01, abs=5e-4)


def test_workbook_ex_7_4_money_lost_per_crash():
    interval = 68.5 * MINUTE
    lost = lost_seconds_per_failure(interval, recovery_seconds=2 * MINUTE)
    assert (interval / 2) / MINUTE == pytest.approx(34.25)
    assert lost / MINUTE == pytest.approx(36.25)
    assert lost / HOUR == pytest.approx(0.604, abs=5e-4)
    cost = failure_cost(512, 2.0, interval, 2 * MINUTE)
    assert cost == pytest.approx(618, abs=1)
    assert 30 * cost == pytest.approx(18_500, abs=100)          # ~30 crashes in 30 days


def test_workbook_ex_7_5_waste_terms_are_equal_at_youngs_interval():
    c, f = 98.0, 24 * HOUR
    tau = young_interval(c, f)
    waste = expected_waste_fraction(tau, c, f)
    assert waste == pytest.approx(tau / f)           # tau/2 lost + C F / tau written = tau
    for other in (0.5 * tau, 2 * tau):
        assert expected_waste_fraction(other, c, f) > waste


@given(noise=st.floats(1.0, 1e5), factor=st.floats(1.01, 1e4))
def test_ch26_ex_16_critical_batch_tends_to_the_noise_scale(noise, factor):
    crit = critical_batch_size(noise, noise * factor)
    assert crit > noise
    assert critical_batch_size(noise, noise * factor * 10) <= crit * (1 + 1e-12)


def test_ch26_ex_16_formula_needs_batch_above_noise_scale():
    with pytest.raises(ValueError, match="batch > noise_scale"):
        critical_batch_size(4096, 1024)
