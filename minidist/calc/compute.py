"""Compute and cost models: 6PD FLOPs, MFU, training time, GPU-hours, dollars, roofline.

Notation: P parameters, D training tokens, peak the GPU's peak FLOP/s (BF16
dense: A100 312e12, H100 989e12), MFU the fraction of it the model's FLOPs use.

    C = 6 P D                        training FLOPs (forward 2PD + backward 4PD)
    T = C / (gpus x peak x MFU)      seconds
    GPU-hours = C / (peak x MFU) / 3600
    PF-days = C / (1e15 x 86400)

Money is in dollars, energy in kWh, power in watts.
"""
from __future__ import annotations

from minidist.calc.units import HOUR, KWH, PFLOP_DAY


def training_flops(params: float, tokens: float) -> float:
    """C = 6 P D FLOPs. Quiz Q18: 7B x 1.4T -> 5.88e22; workbook 9.4: 405B x 15.6T -> 3.79e25."""
    return 6 * params * tokens


def petaflop_days(flops: float) -> float:
    """FLOPs in petaFLOP-days: C / 8.64e19. Workbook 9.4: 3.79e25 -> 438,750."""
    return flops / PFLOP_DAY


def achieved_flops(peak_flops: float, mfu: float, gpus: int = 1) -> float:
    """Model FLOP/s actually delivered: gpus x peak x MFU.

    Quiz Q18: 312 x 0.45 = 140.4 TFLOP/s; workbook 9.5: 16384 x 989e12 x 0.4 = 6.48e18.
    """
    return gpus * peak_flops * mfu


def training_seconds(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """Wall-clock seconds: C / (gpus x peak x MFU). Workbook 9.5: 5.85e6 s = 67.7 days."""
    return flops / achieved_flops(peak_flops, mfu, gpus)


def gpu_hours(flops: float, peak_flops: float, mfu: float) -> float:
    """GPU-hours: C / (peak x MFU) / 3600. Quiz Q18: 5.88e22 at 140.4 TFLOP/s -> 116,300."""
    return flops / achieved_flops(peak_flops, mfu) / HOUR


def mfu(model_flops: float, seconds: float, gpus: int, peak_flops: float) -> float:
    """Model FLOPs Utilization: model FLOPs / (seconds x gpus x peak).

    Quiz Q9 and worked solutions: useful FLOPs 6ND over the hardware peak.
    Workbook 9.5: 3.79e25 FLOPs in 54 days on 16384 H100s -> ~50%.
    """
    return model_flops / (seconds * gpus * peak_flops)


def on_demand_cost(gpu_hours_used: float, price_per_gpu_hour: float) -> float:
    """Dollars: GPU-hours x price. Quiz Q18: 116,300 x $3.50 = $407,000."""
    return gpu_hours_used * price_per_gpu_hour


def spot_cost(gpu_hours_used: float, price_per_gpu_hour: float, discount: float,
              preemptions: int = 0, gpus: int = 1,
              lost_hours_per_preemption: float = 0.0) -> float:
    """Dollars on spot instances, paying again for the work each preemption loses.

    price x (1 - discount) x (GPU-hours + preemptions x gpus x lost hours).
    Chapter 26 ex. 26.20 (65% discount, 30 minutes lost per preemption).
    """
    redone = preemptions * gpus * lost_hours_per_preemption
    return price_per_gpu_hour * (1 - discount) * (gpu_hours_used + redone)


def break_even_preemptions(gpu_hours_used: float, discount: float, gpus: int,
                           lost_hours_per_preemption: float) -> float:
    """Preemptions at which spot costs as much as on-demand (chapter 26 ex. 26.20).

    Solve (1 - d)(H + k g l) = H for k:  k = H d / ((1 - d) g l), with H the
    GPU-hours of the run, d the discount, g GPUs, l hours lost per preemption.
    """
    return gpu_hours_used * discount / ((1 - discount) * gpus * lost_hours_per_preemption)


def electricity_cost(gpus: int, watts_per_gpu: float, hours: float,
                     price_per_kwh: float, pue: float = 1.0) -> float:
    """Dollars of electricity: gpus x W x hours / 1000 x PUE x price per kWh.

    PUE (power usage effectiveness) scales GPU power up to the whole facility.
    Workbook 9.9: 16384 x 700 W for 77 days at $0.05/kWh -> $1.06M; PUE 1.4 -> ~$1.5M.
    """
    kwh = gpus * watts_per_gpu * hours * HOUR / KWH
    return kwh * pue * price_per_kwh


def amdahl_speedup(parallel_fraction: float, workers: int) -> float:
    """Amdahl's law: 1 / ((1 - f) + f / N) for a fraction f that parallelises perfectly.

    Chapter 26 ex. 26.4(b).
    """
    return 1.0 / ((1.0 - parallel_fraction) + parallel_fraction / workers)


def scaling_efficiency(speedup: float, workers: int) -> float:
    """Speedup / N: 1.0 is perfect scaling. Chapter 26 ex. 26.4 (2.8x on 4 GPUs)."""
    return speedup / workers


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved to and from memory (quiz Q8)."""
    return flops / bytes_moved


def matmul_intensity(m: int, n: int, k: int, bytes_per_element: float = 2.0) -> float:
    """Arithmetic intensity of C = A B with A [M, K], B [K, N] (chapter 26 ex. 26.9(a)).

    2 M N K FLOPs over (M K + K N + M N) elements read or written once:
    I = 2MNK / (bytes x (MK + KN + MN)); for square d in FP16, I = d / 3.
    """
    return 2 * m * n * k / (bytes_per_element * (m * k + k * n + m * n))


def elementwise_intensity(flops_per_element: float = 1.0,
                          bytes_per_element: float = 2.0) -> float:
    """Intensity of an elementwise op that reads and writes each element once.

    flops / (2 x bytes). Quiz Q8: ReLU in FP16 -> 1 / 4 = 0.25 FLOP/byte.
    """
    return flops_per_element / (2 * bytes_per_element)


def ridge_point(peak_flops: float, memory_bandwidth: float) -> float:
    """Roofline ridge: peak FLOP/s / bandwidth (FLOP/byte). Quiz Q8: 312e12 / 2e12 = 156."""
    return peak_flops / memory_bandwidth


def attainable_flops(intensity: float, peak_flops: float, memory_bandwidth: float) -> float:
    """Roofline: min(peak, I x bandwidth) FLOP/s (quiz Q8)."""
    return min(peak_flops, intensity * memory_bandwidth)
