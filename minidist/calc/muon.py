"""Sharded Muon: bytes and FLOPs per optimizer step of its two schemes.

Notation: M matrices, matrix i of A_i x B_i elements (P_i = A_i B_i), N ranks each
holding a 1/N piece of every matrix (fully_shard's rows), k Newton-Schulz steps,
B bytes per element. One iteration on a matrix made wide (a = min(A, B),
b = max(A, B)) costs, per step, X X^T (2 a^2 b), G G (2 a^3) and (bG + cG^2) X (2 a^2 b):

    F_i = k (4 a^2 b + 2 a^3)

"gather" (Moonlight's ZeRO-1 scheme): every rank all-gathers every matrix (pieces
padded to ceil(A_i / N) rows) and iterates on all of them:

    bytes sent per rank   sum_i (N - 1) ceil(A_i / N) B_i B     ~ (N - 1)/N sum P_i B
    FLOPs per rank        sum_i F_i          in the world  N sum_i F_i

"round_robin" (torchtitan's dist_muon; Dion): matrix i is iterated by rank i mod N
only; an all-to-all brings it the pieces, another returns each rank its piece of O:

    bytes sent per rank   2 (N - 1)/N * sum_i P_i / N B   (2/N of gather's)
    FLOPs per rank        sum over its matrices of F_i (the busiest: ceil(M / N) of them)
                          in the world  sum_i F_i          (1/N of gather's)

Worked number: GPT-2 small's 48 block matrices (h = 768: (3h, h), (h, h), (4h, h),
(h, 4h) per layer, 12 layers), N = 8, k = 5, fp32: gather sends 297 MB per rank and computes
12.2 TFLOP in the world per step; round robin 74 MB and 1.52 TFLOP.
"""
from __future__ import annotations

import math
from typing import NamedTuple


class MuonStepCost(NamedTuple):
    scheme: str
    bytes_per_rank: float       # bytes each rank sends per step (the pieces it sends)
    flops_per_rank: float       # iteration FLOPs of the busiest rank per step
    flops_in_world: float       # iteration FLOPs of all ranks together per step
    iterations_in_world: int    # Newton-Schulz iterations run in the world per step


def newton_schulz_flops(rows: int, cols: int, steps: int = 5) -> float:
    """F = k (4 a^2 b + 2 a^3), a = min(rows, cols), b = max(rows, cols)."""
    a, b = min(rows, cols), max(rows, cols)
    return steps * (4 * a * a * b + 2 * a ** 3)


def gpt_block_matrices(hidden: int, layers: int) -> list[tuple[int, int]]:
    """The matrices Muon takes in a GPT: c_attn (3h, h), c_proj (h, h), c_fc (4h, h),
    mlp c_proj (h, 4h) per layer (embeddings and head go to AdamW)."""
    h = hidden
    return [(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)] * layers


def muon_step_costs(shapes: list[tuple[int, int]], ranks: int, steps: int = 5,
                    bytes_per_element: float = 4.0) -> list[MuonStepCost]:
    """Both schemes' costs (module docstring) for matrices ``shapes`` over ``ranks``."""
    n, width = ranks, bytes_per_element
    flops = [newton_schulz_flops(a, b, steps) for a, b in shapes]
    total = sum(flops)
    gather_bytes = sum((n - 1) * math.ceil(a / n) * b * width for a, b in shapes)
    elements = sum(a * b for a, b in shapes)
    robin_bytes = 2 * (n - 1) / n * elements / n * width
    busiest = max(sum(flops[r::n]) for r in range(n))
    return [MuonStepCost("gather", gather_bytes, total, n * total, n * len(shapes)),
            MuonStepCost("round_robin", robin_bytes, busiest, total, len(shapes))]
