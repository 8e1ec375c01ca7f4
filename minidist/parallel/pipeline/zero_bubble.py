"""Zero-bubble schedules: the backward split into B and W, and W moved into the bubble.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024). Each backward is two
ops (autograd/weight_grad.py): B(i), the gradient for the stage's input, which
the previous stage waits for, and W(i), the gradient for its weights, which
nothing downstream waits for. A W can therefore run whenever the stage would
otherwise idle, as long as it comes after its B. With equal costs
T_F = T_B = T_W (1F1B's fused backward costs T_B + T_W):

    schedule  bubble (idle / ideal compute)  activations held (micro-batches)
    1F1B      (p-1) / m                      p                  (stage 0)
    ZB-H1     (p-1) / (3m)        (m >= p)   p                  every stage
    ZB-H2     0                (m >= 2p-1)   2p - 1             every stage
    ZB-V      0                 (m >= 2p)    about 1F1B's, two chunks per rank in a V

    zb_h1   1F1B's warm-up of p-r-1 forwards and its F, B order; stage r keeps its
            r oldest W's back and runs them at the end, where it would idle
            waiting for the last B to come back: the bubble shrinks to a third.
    zb_h2   twice 1F1B's warm-up, 2(p-1-r) forwards, fills the start as well;
            stage r keeps 2r W's back for the end. Each stage is busy from its
            first op to its last (a parallelogram): zero bubble when the stages
            step their optimizers without waiting for each other.
    zb_v    two chunks per rank in a V: rank r holds pieces r and 2p-1-r, so
            the first and last pieces (and the loss) sit on rank 0 and a
            micro-batch goes down the ranks and back up. Built by a list
            scheduler (the paper's heuristic, simplified): whenever a rank is
            free it runs a ready B (oldest micro-batch first), else a ready F
            (the deeper piece first) if its activation memory allows, else its
            oldest W. Memory counts a micro-batch chunk as 1 from its F, 1/2
            after its B (B frees what only it needed), 0 after its W, and is
            capped at 2p chunks = 1F1B's p micro-batches.

A stage's bubble here is measured from its own first op to its own last: with
the optimizer step per stage (as the paper's post-validation makes it), the next
step's first forward follows right on, so that span is the step's period.
"""
from __future__ import annotations

from minidist.parallel.pipeline.op import Op, Schedule, check_sizes, virtual_stage


def _deferred_w(stages: int, microbatches: int, warmup_of, held_back_of) -> Schedule:
    """1F1B's shape with W's: warm-up forwards, then F, B pairs; after each B the
    oldest W runs unless the stage keeps ``held_back_of(r)`` W's in reserve."""
    schedule = []
    for r in range(stages):
        warmup = min(warmup_of(r), microbatches)
        ops = [Op("F", i) for i in range(warmup)]
        waiting: list[int] = []                 # micro-batches whose W has not run
        for i in range(microbatches):
            if warmup + i < microbatches:
                ops.append(Op("F", warmup + i))
            ops.append(Op("B", i))
            waiting.append(i)
            if len(waiting) > held_back_of(r):
                ops.append(Op("W", waiting.pop(0)))
        ops += [Op("W", i) for i in waiting]    # the reserve fills the drain
        schedule.append(ops)
    return schedule


def zb_h1(stages: int, microbatches: int) -> Schedule:
    """ZB-H1: 1F1B's order and memory; stage r holds r W's back for the end."""
    check_sizes(stages, microbatches, 1)
    p = stages
    return _deferred_w(p, microbatches, lambda r: p - r - 1, lambda r: r)


def zb_h2(stages: int, microbatches: int) -> Schedule:
    """ZB-H2: 2(p-1-r) warm-up forwards, 2r W's held back: no idle from a stage's
    first op to its last once m >= 2p - 1, for 2p - 1 micro-batches of memory."""
    check_sizes(stages, microbatches, 1)
    p = stages
    return _deferred_w(p, microbatches, lambda r: 2 * (p - r - 1), lambda r: 2 * r)


def zb_v(stages: int, microbatches: int) -> Schedule:
    """ZB-V: two chunks per rank in a V (placement "v"), ordered by the list
    scheduler of the module docstring, every op one time unit."""
    check_sizes(stages, microbatches, 2)
    p, m = stages, microbatches
    limit = 4 * p                                   # in half chunk-activations
    f_done: dict[tuple[int, int], int] = {}         # (piece, micro-batch) -> end time
    b_done: dict[tuple[int, int], int] = {}
    next_f = [[0, 0] for _ in range(p)]             # next micro-batch per chunk
    to_b: list[list[tuple[int, int]]] = [[] for _ in range(p)]   # (mb, chunk) done F
    to_w: list[list[tuple[int, int]]] = [[] for _ in range(p)]   # (mb, chunk) done B
    memory = [0] * p
    schedule: Schedule = [[] for _ in range(p)]
    t, left = 0, 6 * p * m
    while left:
        for r in range(p):
            op = _pick(r, t, p, m, f_done, b_done, next_f, to_b, to_w, memory[r] < limit)
            if op is None:
                continue                            # idle this time unit
            s = virtual_stage(r, op.chunk, p, "v")
            if op.kind == "F":
                f_done[(s, op.microbatch)] = t + 1
                to_b[r].append((op.microbatch, op.chunk))
                memory[r] += 2
            elif op.kind == "B":
                b_done[(s, op.microbatch)] = t + 1
                to_w[r].append((op.microbatch, op.chunk))
                memory[r] -= 1
            else:
                memory[r] -= 1
            schedule[r].append(op)
            left -= 1
        t += 1
        if t > 100 * p * m:                         # cannot happen: a B is always reachable
            raise RuntimeError("zb_v's list scheduler made no progress")
    return schedule


def _pick(r, t, p, m, f_done, b_done, next_f, to_b, to_w, memory_left) -> Op | None:
    """The op rank r starts at time t: a ready B, else a ready F, else a W."""
    last = 2 * p - 1
    ready_b = []
    for mb, c in to_b[r]:
        s = virtual_stage(r, c, p, "v")
        if f_done[(s, mb)] <= t and (s == last or b_done.get((s + 1, mb), t + 1) <= t):
            ready_b.append((mb, -s, c))
    if ready_b:
        mb, _, c = min(ready_b)                     # oldest micro-batch, deeper piece
        to_b[r].remove((mb, c))
        return Op("B", mb, c)
    if memory_left:
        ready_f = []
        for c in (0, 1):
            mb, s = next_f[r][c], virtual_stage(r, c, p, "v")
            if mb < m and (s == 0 or f_done.get((s - 1, mb), t + 1) <= t):
                ready_f.append((-s, mb, c))
        if ready_f:
            _, mb, c = min(ready_f)                 # the deeper piece: reach the loss
            next_f[r][c] += 1
            return Op("F", mb, c)
    if to_w[r]:
        mb, c = to_w[r].pop(0)
        return Op("W", mb, c)
    return None
