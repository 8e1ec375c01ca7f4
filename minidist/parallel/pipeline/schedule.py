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
    zb_h1, zb_h2, zb_v   zero-bubble schedules (zero_bubble.py): the backward
                  split into B (input gradient) and W (weight gradient), and the
                  W's moved into the bubble. zb_v places two chunks per rank in a
                  V (rank r: pieces r and 2p-1-r).
    dualpipe_v    DeepSeek-V3's DualPipeV (dualpipe.py): zb_v's V, its steady
                  state a forward of one chunk paired with a backward of the other.

Bubble (idle time of a stage over its ideal compute time; workbook ch. 5,
minidist.calc.pipeline), for equal-cost stages, t_f + t_b per micro-batch:

    GPipe, 1F1B  (p-1) / m          (1F1B's gain is memory: p micro-batches, not m)
    interleaved  (p-1) / (m v)
    ZB-H1        (p-1) / (3m)       ZB-H2, ZB-V: 0      (t_f = t_b = t_w)
    DualPipeV    (p-1)(F&B + B - 3W) of idle time per rank where 2B = F + 3W (dualpipe.py)

``simulate`` runs a schedule on an idealised machine (every op takes its cost,
messages take no time) and returns each op's start and end; it raises, naming
the dependency, if an op comes before one it needs on its own stage or if the
order can deadlock. ``render_timeline`` draws stages x time slots in ASCII.
The executor (executor.py) runs the same data in real processes.
"""
from __future__ import annotations

from minidist.parallel.pipeline.dualpipe import check_dualpipe_v, dualpipe_v
from minidist.parallel.pipeline.op import (Op, Overlap, Schedule, check_sizes, op_cost,
                                          plain_ops, rank_and_chunk, virtual_stage)
from minidist.parallel.pipeline.zero_bubble import zb_h1, zb_h2, zb_v

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb_h1", "zb_h2", "zb_v", "dualpipe_v")
SPLIT_BACKWARD = ("zb_h1", "zb_h2", "zb_v", "dualpipe_v")   # backward as B + W
V_SHAPED = ("zb_v", "dualpipe_v")               # two chunks per rank, in a V


def gpipe(stages: int, microbatches: int) -> Schedule:
    """F(0..m-1), then B(m-1..0) on every stage."""
    check_sizes(stages, microbatches, 1)
    fwd = [Op("F", i) for i in range(microbatches)]
    bwd = [Op("B", i) for i in reversed(range(microbatches))]
    return [fwd + bwd for _ in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """Warm-up of p - r - 1 forwards, steady 1F1B, cool-down backwards (PipeDream-Flush)."""
    check_sizes(stages, microbatches, 1)
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
    check_sizes(stages, microbatches, virtual)
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


def make_schedule(name: str, stages: int, microbatches: int,
                  virtual: int | None = None) -> Schedule:
    """The schedule called ``name``. ``virtual``, the chunks per rank, is used by
    "interleaved" (None: 1) and checked by "dualpipe_v", which needs exactly 2
    (None: 2); zb_v always has 2 (see ``chunks_per_rank``)."""
    if name == "dualpipe_v":
        check_dualpipe_v(stages, microbatches, 2 if virtual is None else virtual)
        return dualpipe_v(stages, microbatches)
    if name in SPLIT_BACKWARD:
        return {"zb_h1": zb_h1, "zb_h2": zb_h2, "zb_v": zb_v}[name](stages, microbatches)
    if name == "gpipe":
        return gpipe(stages, microbatches)
    if name == "1f1b":
        return one_f_one_b(stages, microbatches)
    if name == "interleaved":
        return interleaved(stages, microbatches, 1 if virtual is None else virtual)
    raise ValueError(f"unknown schedule {name!r}: one of {SCHEDULES}")


def chunks_per_rank(name: str, virtual: int = 1) -> int:
    """Model chunks each rank holds under schedule ``name``."""
    if name in V_SHAPED:
        return 2
    return virtual if name == "interleaved" else 1


def placement(name: str) -> str:
    """How chunks sit on ranks: "loop" (chunk c of rank r is piece c p + r) or
    "v" (zb_v, dualpipe_v: rank r holds pieces r and 2p - 1 - r)."""
    return "v" if name in V_SHAPED else "loop"


# -- where an op's input comes from ------------------------------------------------

def dependency(op: Op, rank: int, stages: int, virtual: int,
               placement: str = "loop") -> tuple[int, Op] | None:
    """The op (on which rank) whose output this op receives, or None (no message:
    the first piece's F, the last piece's B, every W)."""
    s = virtual_stage(rank, op.chunk, stages, placement)
    if op.kind == "W":
        return None                           # only its own B, on this stage
    if op.kind == "F":
        if s == 0:
            return None                       # the first piece reads the micro-batch
        r, c = rank_and_chunk(s - 1, stages, placement)
        return r, Op("F", op.microbatch, c)
    if s == stages * virtual - 1:
        return None                           # the last piece starts from the loss
    r, c = rank_and_chunk(s + 1, stages, placement)
    return r, Op("B", op.microbatch, c)


def check_local_order(schedule: Schedule) -> None:
    """Each op once; on every stage F(i) before B(i) before W(i) (same chunk);
    and, where a schedule has W ops, a W for every B. Raises ValueError naming
    the first violation."""
    split = any(op.kind == "W" for ops in schedule for op in plain_ops(ops))
    for r, ops in enumerate(schedule):
        ops = plain_ops(ops)                  # an F&B as its F, B and W
        seen: set[Op] = set()
        for op in ops:
            if op in seen:
                raise ValueError(f"stage {r} runs {op} twice")
            need = {"B": "F", "W": "B"}.get(op.kind)
            if need and Op(need, op.microbatch, op.chunk) not in seen:
                raise ValueError(f"stage {r}: {op} comes before "
                                 f"{Op(need, op.microbatch, op.chunk)}, which it needs")
            seen.add(op)
        for op in ops:
            wants = ("B", "W") if split else ("B",)
            for kind in wants if op.kind == "F" else ():
                if Op(kind, op.microbatch, op.chunk) not in seen:
                    raise ValueError(f"stage {r} runs {op} but never "
                                     f"{Op(kind, op.microbatch, op.chunk)}")


# -- the idealised run ---------------------------------------------------------------

def simulate(schedule: Schedule, virtual: int = 1, forward_cost: float = 1.0,
             backward_cost: float = 1.0, weight_cost: float | None = None,
             placement: str = "loop", overlapped_cost: float | None = None,
             ) -> list[list[tuple[Op, float, float]]]:
    """(op, start, end) per stage: each op starts once its stage is free and its
    input has arrived; a chunk's op costs 1/v of a stage's.

    ``backward_cost`` is a whole backward; in a schedule with W ops, W takes
    ``weight_cost`` of it (default half) and B the rest, so one call compares
    1F1B and the zero-bubble schedules on the same work; an F&B (op.Overlap)
    waits for both its inputs and costs ``overlapped_cost`` (default forward +
    backward). Raises ValueError if a stage's own order is wrong
    (``check_local_order``), RuntimeError naming what each stuck stage waits
    for if no stage can move while ops remain."""
    check_local_order(schedule)
    p = len(schedule)
    split = any(op.kind == "W" for ops in schedule for op in plain_ops(ops))
    costs = (forward_cost, backward_cost, weight_cost, overlapped_cost)
    cost = {kind: op_cost(kind, costs, split, virtual) for kind in ("F", "B", "W", "F&B")}
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
                deps = _inputs(op, r, p, virtual, placement)
                if any(dep not in done for dep in deps):
                    break
                start = max([free[r]] + [done[dep] for dep in deps])
                free[r] = start + cost[op.kind]
                for part in plain_ops([op]):
                    done[(r, part)] = free[r]
                out[r].append((op, start, free[r]))
                nxt[r] += 1
                remaining -= 1
                moved = True
        if not moved:
            _raise_deadlock(schedule, nxt, done, virtual, placement)
    return out


def _inputs(op, rank: int, stages: int, virtual: int, placement: str) -> list[tuple[int, Op]]:
    """The (rank, op) pairs whose messages ``op`` needs, each half of an F&B's."""
    halves = (op.forward, op.backward) if isinstance(op, Overlap) else (op,)
    deps = [dependency(half, rank, stages, virtual, placement) for half in halves]
    return [dep for dep in deps if dep is not None]


def _raise_deadlock(schedule: Schedule, nxt: list, done: dict, virtual: int,
                    placement: str) -> None:
    """No stage can move: name what each stuck stage waits for."""
    p, waits = len(schedule), []
    for r in range(p):
        if nxt[r] < len(schedule[r]):
            op = schedule[r][nxt[r]]
            for dep_rank, dep_op in _inputs(op, r, p, virtual, placement):
                if (dep_rank, dep_op) not in done:
                    waits.append(f"stage {r}'s {op} waits for {dep_op} of stage {dep_rank}")
    raise RuntimeError("schedule deadlocks: " + "; ".join(waits) +
                       ", each of which comes later in its stage's order")


def render_timeline(timings: list[list[tuple[Op, float, float]]], slot: float = 1.0,
                    width: int = 4) -> str:
    """ASCII chart, one row per stage, one cell per ``slot`` of time; idle is '.'.

    A W op (weight gradient) is drawn in lower case, ``w3``, to tell it from B.

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
                label = str(op) if op.kind != "W" else str(op).lower()
                cells[i] = label[:width - 1].ljust(width - 1)
        lines.append(f"stage {r} |" + " ".join(cells) + "|")
    return "\n".join(lines)
