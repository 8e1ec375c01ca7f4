"""The workbook's Derive exercises: a number, checked against minidist.calc.

Each exercise states the question as the workbook does, the unit of the
answer, the worked number it gives (whose last digit sets the precision the
answer is checked at), the value ``minidist.calc`` computes, and the usual
wrong turns, each as the number it leads to: an answer that matches one of
them is told which term is off.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from minidist import calc

GB = 1e9
MS = 1e-3


@dataclasses.dataclass
class Derive:
    id: str
    title: str
    question: str
    unit: str
    worked: str                       # the document's number, as printed
    value: Callable[[], float]        # minidist.calc's value, in ``unit``
    mistakes: dict[str, Callable[[], float]] = dataclasses.field(default_factory=dict)
    kind: str = "derive"

    def tolerance(self) -> float:
        """Half a unit of the worked number's last printed digit."""
        decimals = len(self.worked.split(".")[1]) if "." in self.worked else 0
        return 0.5 * 10 ** -decimals * 1.0001

    def prompt(self) -> str:
        return f"Exercise {self.id}: {self.title}\n\n{self.question}\n\nanswer in {self.unit}"

    def grade(self, answer: float) -> tuple[bool, str]:
        want, tol = self.value(), self.tolerance()
        if abs(answer - want) <= tol or abs(answer - float(self.worked)) <= tol:
            return True, f"{self.id}: {answer:g} {self.unit} is right (workbook: {self.worked})"
        lines = [f"{self.id}: {answer:g} {self.unit} is not it (to {tol:.2g} {self.unit})"]
        for what, wrong in self.mistakes.items():
            if abs(answer - wrong()) <= max(tol, 1e-9 * abs(wrong())):
                lines.append(f"  it is what you get if {what}")
                break
        else:
            lines.append("  work through each term of the formula in the question")
        lines.append(f"  try again: minidist exercise check {self.id} --answer NUMBER")
        return False, "\n".join(lines)


def _zero(stage, n=64, params=7e9):
    return calc.zero_memory_per_gpu(params, n, stage) / GB


DERIVE = [
    Derive("0.1", "8-GPU all-reduce volume",
           "N = 8 GPUs, each with a gradient of M = 1 GB. How many GB does each GPU "
           "transfer in total during a ring all-reduce?", "GB", "1.75",
           lambda: calc.ring_all_reduce_bytes(1 * GB, 8) / GB,
           {"you counted one phase only (reduce-scatter or all-gather)": lambda: 0.875,
            "you used 2M, forgetting the (N-1)/N": lambda: 2.0}),
    Derive("0.2", "ring all-reduce time",
           "N = 8 GPUs in a ring, 50 GB/s per link, gradient M = 2 GB. All-reduce time, "
           "bandwidth only?", "ms", "70",
           lambda: calc.ring_all_reduce_time(2 * GB, 8, 50 * GB) / MS,
           {"you counted one phase only": lambda: 35.0,
            "you used 2M / BW without the (N-1)/N": lambda: 80.0}),
    Derive("1.1", "7B without ZeRO",
           "7B parameters, mixed-precision Adam, no ZeRO. Memory for model states "
           "(weights + gradients + optimizer) per GPU?", "GB", "112",
           lambda: calc.ddp_memory_per_gpu(7e9) / GB,
           {"you left out the FP32 master weights (12 bytes/param)": lambda: 84.0,
            "you counted only weights and gradients (4 bytes/param)": lambda: 28.0}),
    Derive("1.2", "7B with ZeRO stage 1 on 64 GPUs",
           "7B parameters, ZeRO stage 1, N = 64 GPUs. Memory per GPU for model states?",
           "GB", "29.3", lambda: _zero(1),
           {"you counted optimizer state unsharded (16 bytes/param)": lambda: 112.0,
            "you sharded the gradients too (that is stage 2)": lambda: _zero(2),
            "you sharded everything (that is stage 3)": lambda: _zero(3)}),
    Derive("1.3", "7B with ZeRO stage 2 on 64 GPUs",
           "Same model, ZeRO stage 2, N = 64. Memory per GPU?", "GB", "15.5", lambda: _zero(2),
           {"you left the gradients unsharded (that is stage 1)": lambda: _zero(1),
            "you sharded the weights too (that is stage 3)": lambda: _zero(3)}),
    Derive("1.4", "7B with ZeRO stage 3 on 64 GPUs",
           "Same model, ZeRO stage 3, N = 64. Memory per GPU?", "GB", "1.75", lambda: _zero(3),
           {"you left the weights unsharded (that is stage 2)": lambda: _zero(2)}),
    Derive("2.1", "accumulation steps",
           "Target effective batch 2048, micro-batch 4 per GPU, DP = 8. How many gradient "
           "accumulation steps?", "steps", "64", lambda: calc.accumulation_steps(2048, 4, 8),
           {"you left out the DP degree": lambda: 512.0}),
    Derive("2.2", "communication savings",
           "64 micro-batches per step; each all-reduce takes 50 ms. How many ms does "
           "reducing once per step save over reducing after every micro-batch?", "ms", "3150",
           lambda: calc.all_reduce_seconds_saved(64, 50 * MS) / MS,
           {"you forgot the one all-reduce that remains": lambda: 3200.0}),
    Derive("3.1", "linear scaling",
           "Base LR 3e-4 at batch 256; new batch 2048. LR under linear scaling?", "", "0.0024",
           lambda: calc.linear_scaled_lr(3e-4, 256, 2048),
           {"you used the square-root rule": lambda: calc.sqrt_scaled_lr(3e-4, 256, 2048)}),
    Derive("3.2", "square-root scaling",
           "Base LR 3e-4 at batch 256; new batch 2048. LR under square-root scaling?", "",
           "0.000849", lambda: calc.sqrt_scaled_lr(3e-4, 256, 2048),
           {"you used the linear rule": lambda: calc.linear_scaled_lr(3e-4, 256, 2048)}),
    Derive("3.3", "warmup steps",
           "Batch 2048, scaled from 256; warmup = (B_new / B_base) x 1000 steps. How many?",
           "steps", "8000", lambda: calc.warmup_steps(256, 2048)),
    Derive("4.1", "all-reduce time for a 10B model",
           "10B parameters, FP16 gradients, 64 GPUs, 600 GB/s per GPU. Ring all-reduce time?",
           "ms", "65.6", lambda: calc.ring_all_reduce_time(20 * GB, 64, 600 * GB) / MS,
           {"you used FP32 gradients (4 bytes)": lambda: 131.25,
            "you counted one phase only": lambda: 32.8125}),
    Derive("4.3", "inter-node bottleneck",
           "8 nodes of 8 GPUs, 100 GB/s between nodes; a 10B model (FP16 gradients). Time of "
           "the cross-node ring all-reduce (8 nodes)?", "ms", "350",
           lambda: calc.ring_all_reduce_time(20 * GB, 8, 100 * GB) / MS,
           {"you used all 64 GPUs in the ring": lambda: calc.ring_all_reduce_time(20 * GB, 64, 100 * GB) / MS}),
    Derive("5.1", "pipeline bubble",
           "PP = 4 stages, m = 12 micro-batches, 1F1B. Bubble fraction?", "%", "25",
           lambda: 100 * calc.bubble_fraction(4, 12, "1f1b"),
           {"you divided by the whole step, (p-1)/(m+p-1), not by the useful compute":
            lambda: 100 * calc.idle_fraction(4, 12, "1f1b")}),
    Derive("5.3", "interleaved 1F1B",
           "PP = 4, m = 12, v = 4 virtual stages per GPU. Bubble fraction?", "%", "6.25",
           lambda: 100 * calc.bubble_fraction(4, 12, "interleaved", 4),
           {"you forgot v": lambda: 25.0}),
    Derive("5.4", "point-to-point communication",
           "Activations of 500 MB per micro-batch between stages; PP = 4, m = 12, v = 4. "
           "Total point-to-point data per step, forward and backward?", "GB", "180",
           lambda: calc.p2p_volume(0.5 * GB, 4, 12, 4) / GB,
           {"you counted the forward sends only": lambda: 90.0,
            "you used PP x v boundaries instead of PP x v - 1": lambda: 192.0}),
    Derive("6.5", "TP scaling limit",
           "320 TP all-reduces per step of 0.09 ms each; compute takes 300 ms. TP "
           "communication overhead?", "%", "9.6",
           lambda: 100 * calc.comm_compute_ratio(320 * 0.09 * MS, 300 * MS)),
    Derive("7.2", "checkpoint write time",
           "A 980 GB checkpoint, written at 10 GB/s. How long?", "s", "98",
           lambda: calc.checkpoint_write_seconds(980 * GB, 10 * GB)),
    Derive("7.3", "optimal checkpoint frequency",
           "MTBF 24 hours, checkpoint C = 98 s. Young's interval sqrt(2 C F), in minutes?",
           "minutes", "68.5", lambda: calc.young_interval(98, 24 * 3600) / 60,
           {"you left out the 2 under the root": lambda: calc.young_interval(49, 24 * 3600) / 60}),
    Derive("8.1", "FP16 range",
           "FP16's smallest positive normal number is 2^-14. How many x 1e-5?", "x 1e-5",
           "6.1035", lambda: calc.format_min_normal(5) * 1e5,
           {"you computed the smallest subnormal 2^-24": lambda: calc.format_min_subnormal(5, 10) * 1e5}),
    Derive("8.3", "memory of mixed precision",
           "Bytes per parameter of mixed-precision Adam over pure FP32 Adam: the ratio?", "",
           "1.0", lambda: calc.model_state_bytes_per_param(precision="mixed")
           / calc.model_state_bytes_per_param(precision="fp32"),
           {"you left out the FP32 master weights": lambda: 0.75}),
]
