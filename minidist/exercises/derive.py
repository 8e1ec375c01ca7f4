"""The workbook's Derive exercises: a number, checked against minidist.calc.

Each exercise states the question as the workbook does, the unit of the
answer, the worked number it gives (whose last digit sets the precision the
answer is checked at), the value ``minidist.calc`` computes, and the usual
wrong turns, each as the number it leads to: an answer that matches one of
them is told which term is off.

Where the workbook's printed answer is wrong (docs/cost_models.md, "Where the
source numbers are wrong"), ``worked`` is the corrected number at the printed
precision, ``printed`` what the workbook prints, and ``erratum`` the term it
gets wrong: an answer equal to the printed number is told so.

This file: the class and chapters 0-4 (ring all-reduce, ZeRO, accumulation,
LR scaling, communication); derive_5_9.py: pipelines, tensor parallelism,
checkpoints, precision and the 405B capstone.
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
    printed: str = ""                 # the workbook's number, where it is wrong
    erratum: str = ""                 # what that number gets wrong
    kind: str = "derive"

    def wrong_turns(self) -> dict[str, Callable[[], float]]:
        """The named mistakes, the workbook's own slip (if any) first."""
        slip = {self.erratum: lambda: float(self.printed)} if self.printed else {}
        return {**slip, **self.mistakes}

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
        for what, wrong in self.wrong_turns().items():
            if abs(answer - wrong()) <= max(tol, 1e-9 * abs(wrong())):
                lines.append(f"  it is what you get if {what}")
                break
        else:
            lines.append("  work through each term of the formula in the question")
        lines.append(f"  try again: minidist exercise check {self.id} --answer NUMBER")
        return False, "\n".join(lines)


def _zero(stage, n=64, params=7e9):
    return calc.zero_memory_per_gpu(params, n, stage) / GB


CHAPTERS_0_4 = [
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
    Derive("1.5", "ZeRO stage 3 communication cost",
           "ZeRO-3: one all-gather of the FP16 weights before the forward, one before the "
           "backward, one reduce-scatter of the gradients after it. 7B model (14 GB of FP16 "
           "weights), 64 GPUs. How many GB does each GPU send per step?", "GB", "41.3",
           lambda: 3 * calc.all_gather_bytes(14 * GB, 64) / GB,
           {"you counted each collective as an all-reduce, 2(N-1)/N M":
            lambda: 3 * calc.ring_all_reduce_bytes(14 * GB, 64) / GB,
            "you left out the all-gather before the backward":
            lambda: 2 * calc.all_gather_bytes(14 * GB, 64) / GB,
            "you rounded (N-1)/N to 1 (3 x 14, the workbook's rough '~42 GB')": lambda: 42.0}),
    Derive("2.1", "accumulation steps",
           "Target effective batch 2048, micro-batch 4 per GPU, DP = 8. How many gradient "
           "accumulation steps?", "steps", "64", lambda: calc.accumulation_steps(2048, 4, 8),
           {"you left out the DP degree": lambda: 512.0}),
    Derive("2.2", "communication savings",
           "64 micro-batches per step; each all-reduce takes 50 ms. How many ms does "
           "reducing once per step save over reducing after every micro-batch?", "ms", "3150",
           lambda: calc.all_reduce_seconds_saved(64, 50 * MS) / MS,
           {"you forgot the one all-reduce that remains": lambda: 3200.0}),
    Derive("2.3", "throughput with accumulation",
           "8 GPUs, micro-batch 4, 64 accumulation steps (2048 sequences per step). A "
           "micro-batch's forward + backward takes 120 ms, the one all-reduce 50 ms, the "
           "optimizer step 1 ms. Throughput in sequences/second, across all 8 GPUs?",
           "sequences/s", "265",
           lambda: 2048 / calc.accumulation_step_seconds(64, 120 * MS, 50 * MS, 1 * MS),
           {"you all-reduced after every micro-batch, not once per step":
            lambda: 2048 / calc.accumulation_step_seconds(64, 170 * MS, 0, 1 * MS),
            "you counted one GPU's sequences (2048 is the batch of all 8)":
            lambda: 2048 / 8 / calc.accumulation_step_seconds(64, 120 * MS, 50 * MS, 1 * MS)}),
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
    Derive("4.2", "overlap analysis",
           "Backward takes 200 ms over 40 layers (5 ms each); each layer's bucketed "
           "all-reduce takes 1.5 ms and runs during the next layer's backward. What "
           "percentage of the communication is overlapped?", "%", "97.5",
           lambda: 100 * calc.overlap_fraction(40, 1.5 * MS, 5 * MS),
           {"you computed one minus the overhead, 1 - 1.5 ms / 200 ms, not the share of "
            "the communication hidden":
            lambda: 100 * (1 - calc.comm_overhead_fraction(40, 1.5 * MS, 5 * MS)),
            "you gave the exposed share, the last layer's 1.5 ms of 60 ms":
            lambda: 100 * (1 - calc.overlap_fraction(40, 1.5 * MS, 5 * MS))}),
    Derive("4.3", "inter-node bottleneck",
           "8 nodes of 8 GPUs, 100 GB/s between nodes; a 10B model (FP16 gradients). Time of "
           "the cross-node ring all-reduce (8 nodes)?", "ms", "350",
           lambda: calc.ring_all_reduce_time(20 * GB, 8, 100 * GB) / MS,
           {"you used all 64 GPUs in the ring": lambda: calc.ring_all_reduce_time(20 * GB, 64, 100 * GB) / MS}),
]
