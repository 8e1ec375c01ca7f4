"""Training recipes: effective batch, accumulation, LR scaling, warmup, checkpoint interval.

Workbook chapters 2 (gradient accumulation), 3 (learning-rate scaling) and 7
(checkpoint and recovery); chapter 26 ex. 26.15-26.16. Times are in seconds.

    B_eff = micro_batch x accumulation_steps x DP
    lr = lr_base x B / B_base          (linear, Goyal et al. 2017)
    lr = lr_base x sqrt(B / B_base)    (square root)
    tau = sqrt(2 C F)                  (Young: C checkpoint time, F MTBF)

The two LR rules are the same as ``minidist.optim``'s ``linear_scaled_lr`` and
``sqrt_scaled_lr``, restated so that calc depends on nothing.
"""
from __future__ import annotations

import math

from minidist.calc.units import HOUR


def effective_batch(micro_batch: int, accumulation_steps: int, dp: int) -> int:
    """B_eff = micro_batch x accumulation_steps x DP (workbook ex. 2.4).

    Workbook ch. 9: 1 x 4 x 128 = 512 sequences for Llama 3.1 405B.
    """
    return micro_batch * accumulation_steps * dp


def accumulation_steps(target_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per optimizer step: ceil(B_eff / (micro_batch x DP)).

    Workbook 2.1: 2048 / (4 x 8) = 64; 2.5: 2048 / (8 x 8) = 32.
    """
    return math.ceil(target_batch / (micro_batch * dp))


def accumulation_step_seconds(accumulation_steps: int, microbatch_seconds: float,
                              all_reduce_seconds: float,
                              optimizer_seconds: float = 0.0) -> float:
    """One optimizer step with accumulation: k x t_micro + one all-reduce + the update.

    Workbook 2.3: 64 x 120 ms + 50 ms + 1 ms = 7731 ms.
    """
    return accumulation_steps * microbatch_seconds + all_reduce_seconds + optimizer_seconds


def all_reduce_seconds_saved(accumulation_steps: int, all_reduce_seconds: float) -> float:
    """Communication saved per optimizer step by reducing once instead of k times.

    (k - 1) x t_ar. Workbook 2.2: 64 x 50 - 50 = 3150 ms.
    """
    return (accumulation_steps - 1) * all_reduce_seconds


def linear_scaled_lr(base_lr: float, base_batch: int, new_batch: int) -> float:
    """Linear scaling rule: lr_base x B_new / B_base.

    Workbook 3.1: 3e-4 x 2048/256 = 2.4e-3. Chapter 26 ex. 26.15; quiz Q14.
    """
    return base_lr * new_batch / base_batch


def sqrt_scaled_lr(base_lr: float, base_batch: int, new_batch: int) -> float:
    """Square-root scaling rule: lr_base x sqrt(B_new / B_base). Workbook 3.2: 8.49e-4."""
    return base_lr * math.sqrt(new_batch / base_batch)


def warmup_steps(base_batch: int, new_batch: int, steps_per_unit: int = 1000) -> int:
    """The workbook's warmup heuristic: W = (B_new / B_base) x 1000 steps.

    Workbook 3.3: 2048/256 x 1000 = 8000 steps (8% of 100k).
    """
    return round(new_batch / base_batch * steps_per_unit)


def critical_batch_size(noise_scale: float, batch: float) -> float:
    """B_crit = B_noise / (1 - B_noise / B), as chapter 26 ex. 26.16(a) states it.

    B_noise = tr(Sigma) / |grad L|^2 is the gradient noise scale (McCandlish et
    al., 2018). As the formula is written it needs B > B_noise and tends to
    B_noise as B grows.
    """
    if batch <= noise_scale:
        raise ValueError(f"the formula needs batch > noise_scale, got {batch} <= {noise_scale}")
    return noise_scale / (1 - noise_scale / batch)


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimal checkpoint interval: tau = sqrt(2 C F) (seconds).

    Workbook 7.3: C = 98 s, F = 24 h -> sqrt(2 x 0.0272 x 24) h = 1.143 h = 68.5 min.
    """
    return math.sqrt(2 * checkpoint_seconds * mtbf_seconds)


def expected_waste_fraction(interval_seconds: float, checkpoint_seconds: float,
                            mtbf_seconds: float) -> float:
    """Fraction of time lost per MTBF: (tau / 2 + C x F / tau) / F (workbook ex. 7.5).

    tau/2: the work lost to a failure, on average half an interval; C F / tau:
    the checkpoints written in one MTBF. At Young's tau the two terms are equal.
    """
    lost = interval_seconds / 2
    writing = checkpoint_seconds * mtbf_seconds / interval_seconds
    return (lost + writing) / mtbf_seconds


def checkpoint_overhead(interval_seconds: float, checkpoint_seconds: float) -> float:
    """Time spent writing checkpoints as a fraction of the interval: C / tau.

    Workbook 7.3: 98 s every 68.5 minutes = 2.4%; ch. 7 text: 98 s every
    1000 steps x 10 s = 1%.
    """
    return checkpoint_seconds / interval_seconds


def lost_seconds_per_failure(interval_seconds: float, recovery_seconds: float = 0.0) -> float:
    """Expected time lost to one failure: tau / 2 (half an interval) + recovery.

    Workbook 7.4: 68.5 / 2 + 2 minutes = 36.25 minutes.
    """
    return interval_seconds / 2 + recovery_seconds


def failure_cost(gpus: int, price_per_gpu_hour: float, interval_seconds: float,
                 recovery_seconds: float = 0.0) -> float:
    """Dollars lost per failure: gpus x price x lost hours (workbook 7.4: $618)."""
    lost_hours = lost_seconds_per_failure(interval_seconds, recovery_seconds) / HOUR
    return gpus * price_per_gpu_hour * lost_hours
