"""Pipeline schedules as plain data: for each stage, the ordered forward / backward ops.

A model cut into p stages (one per rank) trains on a batch cut into m micro-batches.
A schedule says, for every stage, in which order it runs F(i) (forward of
micro-batch i) and B(i) (its backward). Interleaved schedules give each rank v
model chunks (virtual stages): rank r holds chunks r, r + p, ..., r + (v-1) p of
the p v pieces, and an op names its chunk.

    GPipe         all m forwards, then all m backwards (in reverse order).
                  Holds the activations of all m micro-batches at once.
    1F1B          p - r - 1 warm-up forwards, then one forward, one backward, ...,
                  then the remaining backwards. At most p - r micro-batches in flight.
    interleaved   1F1B over v chunks per rank (Narayanan et al., 2021): forwards go
                  p micro-batches per chunk at a time; more warm-up, v times
                  shorter fill and drain.

Bubble (idle time of a stage; workbook ch. 5, minidist.calc.pipeline), for
equal-cost stages, t_f + t_b per micro-batch per stage:

    GPipe        idle / useful = (p-1) / m
    1F1B         idle / useful = (p-1) / m         (same idle time as GPipe)
    interleaved  idle / useful = (p-1) / (m v)

``simulate`` runs a schedule on an idealised machine (every op takes its cost,
messages take no time) and returns each op's start and end, or raises if the
order can deadlock; ``render_timeline`` draws stages x time slots in ASCII.
The executor (executor.py) runs the same data in real processes.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class Op:
    kind: str           # "F" (forward) or "B" (backward)
    microbatch: int     # 0 .. m-1
    chunk: int = 0      # model chunk on this rank (interleaved), 0 .. v-1

    def __str__(self) -> str:
        chunk = "" if self.chunk == 0 else "abcdefgh"[self.chunk % 8]
        return f"{self.kind}{self.microbatch}{chunk}"


Schedule = list[list[Op]]   # schedule[stage] = that stage's ops, in order


def gpipe(stages: int, microbatches: int) -> Schedule:
    """F(0..m-1), then B(m-1..0) on every stage."""
    _check(stages, microbatches, 1)
    fwd = [Op("F", i) for i in range(microbatches)]
    bwd = [Op("B", i) for i in reversed(range(microbatches))]
    return [fwd + bwd for _ in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """Warm-up of p - r - 1 forwards, steady 1F1B, cool-down backwards (PipeDream-Flush)."""
    _check(stages, microbatches, 1)
    schedule = []
    for r in range(stages):
        warmup = min(stages - r - 1, microbatches)
        ops = [Op("F", i) for i in range(warmup)]
        next_f, next_b = warmup, 0
        while next_f < microbatches:          # steady state: one forward, one backward
            ops.append(Op("F", next_f))
            ops.append(Op("B", next_b))
            next_f, next_b = next_f + 1, next_b + 1
        ops += [Op("B", i) for i in range(next_b, microbatches)]   # cool-down
        schedule.append(ops)
    return schedule


def interleaved(stages: int, microbatches: int, virtual: int) -> Schedule:
    """Interleaved 1F1B with ``virtual`` chunks per rank (Megatron-LM's order).

    The k-th forward of a rank is micro-batch (k // (p v)) p + k mod p of chunk
    (k // p) mod v: p micro-batches through chunk 0, the same p through chunk 1, ...
    Backwards run the same way with the chunks in reverse. Rank r warms up with
    (p - r - 1) 2 + (v - 1) p forwards. Needs m to be a multiple of p.
    """
    _check(stages, microbatches, virtual)
    p, m, v = stages, microbatches, virtual
    if v == 1:
        return one_f_one_b(p, m)
    if m % p:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({m}) to be a "
                         f"multiple of the stages ({p})")
    total = m * v

    def nth(k: int, kind: str) -> Op:
        chunk = (k // p) % v
        if kind == "B":
            chunk = v - 1 - chunk
        return Op(kind, (k // (p * v)) * p + k % p, chunk)

    schedule = []
    for r in range(p):
        warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
        ops = [nth(k, "F") for k in range(warmup)]
        for k in range(warmup, total):        # steady state
            ops.append(nth(k, "F"))
            ops.append(nth(k - warmup, "B"))
        ops += [nth(k, "B") for k in range(total - warmup, total)]
        schedule.append(ops)
    return schedule


def make_schedule(name: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    if name == "gpipe":
        return gpipe(stages, microbatches)
    if name == "1f1b":
        return one_f_one_b(stages, microbatches)
    if name == "interleaved":
        return interleaved(stages, microbatches, virtual)
    raise ValueError(f"unknown schedule {name!r}: one of {SCHEDULES}")


def _check(stages: int, microbatches: int, virtual: int) -> None:
    if stages < 1 or microbatches < 1 or virtual < 1:
        raise ValueError(f"stages, micro-batches and virtual stages must be >= 1, got "
                         f"{stages}, {microbatches}, {virtual}")


# -- where an op's input comes from ------------------------------------------------

def virtual_stage(rank: int, chunk: int, stages: int) -> int:
    """Position of (rank, chunk) in the model: chunk c of rank r is piece c p + r."""
    return chunk * stages + rank


def dependency(op: Op, rank: int, stages: int, virtual: int) -> tuple[int, Op] | None:
    """The op (on which rank) whose output this op receives, or None (no message)."""
    s = virtual_stage(rank, op.chunk, stages)
    if op.kind == "F":
        if s == 0:
            return None                       # the first piece reads the micro-batch
        prev = s - 1
        return prev % stages, Op("F", op.microbatch, prev // stages)
    if s == stages * virtual - 1:
        return None                           # the last piece starts from the loss
    nxt = s + 1
    return nxt % stages, Op("B", op.microbatch, nxt // stages)


# -- the idealised run ---------------------------------------------------------------

def simulate(schedule: Schedule, virtual: int = 1, forward_cost: float = 1.0,
             backward_cost: float = 1.0) -> list[list[tuple[Op, float, float]]]:
    """(op, start, end) per stage: each op starts once its stage is free and its
    input has arrived; a chunk's op costs 1/v of a stage's. Raises RuntimeError
    if no stage can move while ops remain (the order would deadlock)."""
    p = len(schedule)
    done: dict[tuple[int, Op], float] = {}
    nxt = [0] * p
    free = [0.0] * p
    out: list[list] = [[] for _ in range(p)]
    remaining = sum(len(ops) for ops in schedule)
    while remaining:
        moved = False
        for r in range(p):
            while nxt[r] < len(schedule[r]):
                op = schedule[r][nxt[r]]
                dep = dependency(op, r, p, virtual)
                if dep is not None and dep not in done:
                    break
                cost = (forward_cost if op.kind == "F" else backward_cost) / virtual
                start = max(free[r], done[dep] if dep is not None else 0.0)
                free[r] = start + cost
                done[(r, op)] = free[r]
                out[r].append((op, start, free[r]))
                nxt[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            stuck = {r: str(schedule[r][nxt[r]]) for r in range(p) if nxt[r] < len(schedule[r])}
            raise RuntimeError(f"schedule deadlocks: each stage waits for an op that "
                               f"never runs ({stuck})")
    return out


def render_timeline(timings: list[list[tuple[Op, float, float]]], slot: float = 1.0,
                    width: int = 4) -> str:
    """ASCII chart, one row per stage, one cell per ``slot`` of time; idle is '.'.

    Works on ``simulate``'s slots and on measured seconds alike (pass the op
    duration as ``slot``)."""
    t0 = min(t[1] for row in timings for t in row)
    end = max(t[2] for row in timings for t in row)
    n = int(round((end - t0) / slot))
    lines = []
    for r, row in enumerate(timings):
        cells = ["." * (width - 1)] * n
        for op, start, stop in row:
            # position from the start, length from the duration: measured ops that
            # drift by a fraction of a slot keep their length instead of growing one
            first = int(round((start - t0) / slot))
            length = max(1, int(round((stop - start) / slot)))
            for i in range(first, min(first + length, n)):
                cells[i] = str(op)[:width - 1].ljust(width - 1)
        lines.append(f"stage {r} |" + " ".join(cells) + "|")
    return "\n".join(lines)
