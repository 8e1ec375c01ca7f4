"""One op of a pipeline schedule, where the model's pieces sit, and what an op costs.

The pieces both schedule.py and zero_bubble.py build on (and the executor
runs): an ``Op`` is F (forward), B (backward; the input gradient only where
the schedule has W ops) or W (weight gradient) of one micro-batch on one
model chunk; ``Schedule`` is every stage's list of them, in order.

A model cut into P = p v pieces sits on p ranks with v chunks each:

    "loop"  chunk c of rank r is piece c p + r          (GPipe, 1F1B, interleaved)
    "v"     rank r holds pieces r and 2p - 1 - r        (zb_v)

What an op costs, for stages of forward cost t_f and backward cost t_b, one
chunk being 1/v of a stage (the one rule for the simulator and the executor):

    F  t_f / v      B  t_b / v, or (t_b - t_w) / v where the schedule has W ops
    W  t_w / v      t_w = half of t_b unless given
    F&B  t_fb / v   t_fb = t_f + t_b (no overlap gained) unless given
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    kind: str           # "F" forward, "B" backward (input gradient only if the
                        # schedule has W ops), "W" weight gradient
    microbatch: int     # 0 .. m-1
    chunk: int = 0      # model chunk on this rank (interleaved), 0 .. v-1

    def __str__(self) -> str:
        chunk = "" if self.chunk == 0 else "abcdefgh"[self.chunk % 8]
        return f"{self.kind}{self.microbatch}{chunk}"


@dataclass(frozen=True)
class Overlap:
    """F&B (DualPipeV): the forward of one micro-batch on one chunk and the full
    backward (B, then W) of another on the other chunk, run as one op: it starts
    once both inputs are here, and its two sends leave as each half is done, so
    the communication of one half can hide behind the compute of the other."""
    forward: Op         # an F
    backward: Op        # a B; its W runs inside this op too
    kind = "F&B"        # (a class constant, not a field)

    def parts(self) -> tuple[Op, Op, Op]:
        """The plain ops it runs, in order: F, B, W."""
        b = self.backward
        return self.forward, b, Op("W", b.microbatch, b.chunk)

    def trace_labels(self) -> tuple[tuple[str, str], tuple[dict, dict]]:
        """The names and args of its two halves' spans in a trace ("F3", "B1 c1")."""
        halves = (self.forward, self.backward)
        return (tuple(op_label(h) for h in halves),
                tuple(dict(microbatch=h.microbatch, chunk=h.chunk) for h in halves))

    def __str__(self) -> str:
        return f"{self.forward}&{self.backward}"


def op_label(op: Op) -> str:
    """An op's name in a trace: "F3", "B1 c1" (micro-batch 1, chunk 1)."""
    return f"{op.kind}{op.microbatch}" + (f" c{op.chunk}" if op.chunk else "")


Schedule = list[list["Op | Overlap"]]   # schedule[stage] = that stage's ops, in order


def plain_ops(ops: list) -> list[Op]:
    """A stage's ops with every F&B opened into its F, B and W."""
    out: list[Op] = []
    for op in ops:
        out.extend(op.parts() if isinstance(op, Overlap) else (op,))
    return out


def check_sizes(stages: int, microbatches: int, virtual: int) -> None:
    """Raise ValueError unless every size of a schedule is at least 1."""
    if stages < 1 or microbatches < 1 or virtual < 1:
        raise ValueError(f"stages, micro-batches and virtual stages must be >= 1, got "
                         f"{stages}, {microbatches}, {virtual}")


def virtual_stage(rank: int, chunk: int, stages: int, placement: str = "loop") -> int:
    """Position of (rank, chunk) in the model: chunk c of rank r is piece c p + r
    ("loop"); with "v", chunk 0 is piece r and chunk 1 piece 2p - 1 - r."""
    if placement == "v":
        return rank if chunk == 0 else 2 * stages - 1 - rank
    return chunk * stages + rank


def rank_and_chunk(piece: int, stages: int, placement: str = "loop") -> tuple[int, int]:
    """The inverse of ``virtual_stage``."""
    if placement == "v":
        return (piece, 0) if piece < stages else (2 * stages - 1 - piece, 1)
    return piece % stages, piece // stages


def op_cost(kind: str, costs: tuple, split: bool, virtual: int = 1) -> float:
    """The cost of one ``kind`` op of a chunk, from ``costs`` = (forward, backward[,
    weight[, overlapped]]) of a whole stage (the module docstring): with W ops
    (``split``) W takes ``weight`` of the backward (half when it is missing or None)
    and B the rest; an F&B costs ``overlapped`` (forward + backward when missing)."""
    forward, backward = costs[0], costs[1]
    weight = costs[2] if len(costs) > 2 and costs[2] is not None else backward / 2
    if kind == "F&B":
        both = costs[3] if len(costs) > 3 and costs[3] is not None else forward + backward
        return both / virtual
    if kind == "F":
        return forward / virtual
    if kind == "W":
        return weight / virtual
    return (backward - weight if split else backward) / virtual
