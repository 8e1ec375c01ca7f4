"""Pipeline parallelism: run a schedule (schedule.py) in real processes.

Each rank of the pipeline group holds v model chunks (v = 1 unless interleaved);
chunk c of rank r is piece c p + r of the model. For every op of its schedule,
in order, a rank does:

    F(i, c)   receive x from the previous piece (unless first) -> y = chunk_c(x)
              -> send y to the next piece (unless last; the last piece returns
              micro-batch i's loss instead)
    B(i, c)   receive dL/dy from the next piece (unless last) -> backward through
              chunk_c -> send dL/dx to the previous piece (unless first)

The step's loss is the mean of the m micro-batch losses, so the last piece starts
each backward from dL/dloss_i = 1/m, and parameter gradients add up over the
micro-batches: the same gradient as one pass over the whole batch (pipelining
changes the order of work, not the math; worked solutions, "1F1B equivalence").

Why this never deadlocks: every send is non-blocking (``isend``), so a rank only
ever waits in a receive, for an op that comes earlier in the producing rank's
own order. ``simulate`` plays the same orders with the same dependencies and
raises if they can get stuck; the schedules here pass it for every (p, m, v),
and the real run waits on exactly those dependencies. Messages are told apart
by tag (kind, chunk, micro-batch), so arrival order does not matter.

Measurement: each op's start and end (``time.perf_counter``, one clock for all
processes of a machine) are recorded; ``measured_bubble`` turns them into the
bubble fraction of calc.pipeline, and the largest number of micro-batches whose
activations a rank held at once is counted (GPipe: m; 1F1B: p - r).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import minidist.distributed as dist
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn.module import Module
from minidist.parallel.pipeline.schedule import Op, virtual_stage

_TAG_BASE = 1 << 20   # pipeline tags: base + ((kind P + sending piece) m + micro-batch)


def split_layers(n_layers: int, pieces: int) -> list[range]:
    """Consecutive layer ranges, sizes differing by at most one (the larger first).

    A piece needs at least one layer: fewer layers than pieces is an error."""
    if pieces < 1 or n_layers < pieces:
        raise ValueError(f"cannot split {n_layers} layers into {pieces} pipeline pieces "
                         f"(stages x virtual stages): every piece needs at least one layer")
    base, extra = divmod(n_layers, pieces)
    ranges, start = [], 0
    for k in range(pieces):
        size = base + (1 if k < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


@dataclass
class PipelineStats:
    """What one rank saw in one step."""
    losses: list = field(default_factory=list)        # micro-batch losses (last piece only)
    timeline: list = field(default_factory=list)      # (Op, start, end), perf_counter seconds
    peak_inflight: int = 0                            # most activations held at once


def _global(group: Any, group_rank: int) -> int:
    return group_rank if group is None else group.ranks[group_rank]


def run_pipeline(ops: Sequence[Op], chunks: Sequence[Module], microbatches: int,
                 inputs: Sequence | None, targets: Sequence | None, *,
                 activation_shape: tuple, dtype: Any, group: Any = None,
                 op_seconds: tuple[float, float] | None = None) -> PipelineStats:
    """Run this rank's ``ops`` over its ``chunks`` (v modules) for one step.

    inputs / targets: the m micro-batches, arrays of the backend (needed by the ranks
    holding the first / last piece; others may pass None). The first piece is called as chunk(ids),
    the last as chunk(x, targets) -> scalar loss, the others as chunk(x) -> y.
    ``activation_shape`` / ``dtype``: of every tensor passed between pieces.
    ``op_seconds`` = (forward, backward): make every op last at least that long
    (1/v of it per chunk op), so that measured bubbles compare with formulas
    for equal-cost stages. Gradients accumulate into the chunks' parameters.
    """
    p, r = dist.get_world_size(group), dist.get_rank(group)
    v, m = len(chunks), microbatches
    n_pieces = p * v
    stats = PipelineStats()
    saved: dict[tuple[int, int], tuple[Tensor | None, Tensor]] = {}   # (mb, chunk) -> (x, y)
    sends: list = []          # pending isends; their arrays must live until waited on

    def tag(kind: str, sender: int, mb: int) -> int:
        """One tag per message: activations ("F") or gradients ("B"), from piece
        ``sender``, of micro-batch ``mb``."""
        return _TAG_BASE + (("F", "B").index(kind) * n_pieces + sender) * m + mb

    def receive(kind: str, sender: int, mb: int) -> Any:
        buf = xp.empty(activation_shape, dtype=dtype)
        dist.recv(buf, _global(group, sender % p), group, tag(kind, sender, mb))
        return buf

    def send(arr: Any, kind: str, sender: int, receiver: int, mb: int) -> None:
        arr = xp.ascontiguousarray(arr)    # piece k lives on rank k mod p
        sends.append((dist.isend(arr, _global(group, receiver % p), group,
                                 tag(kind, sender, mb)), arr))

    def pad(kind: str, start: float) -> None:
        # make the op's compute last a fixed time: equal-cost stages, whatever the load
        if op_seconds is not None:
            _sleep_until(start + (op_seconds[0] if kind == "F" else op_seconds[1]) / v)

    for op in ops:
        s = virtual_stage(r, op.chunk, p)           # this piece's place in the model
        first, last = s == 0, s == n_pieces - 1
        i = op.microbatch
        if op.kind == "F":
            x = None if first else Tensor(receive("F", s - 1, i), requires_grad=True)
            start = time.perf_counter()             # the op runs from its input's arrival
            inp = inputs[i] if first else x
            out = chunks[op.chunk](inp, targets[i]) if last else chunks[op.chunk](inp)
            saved[(i, op.chunk)] = (x, out)
            stats.peak_inflight = max(stats.peak_inflight, len(saved))
            pad("F", start)
            if last:
                stats.losses.append(float(out.data))
            else:
                send(out.data, "F", s, s + 1, i)
        else:
            x, out = saved.pop((i, op.chunk))
            if last:
                grad = xp.full(out.shape, 1.0 / m, dtype=out.dtype)      # d(mean)/d(loss_i)
            else:
                grad = receive("B", s + 1, i)
            start = time.perf_counter()
            out.backward(grad)
            pad("B", start)
            if not first:
                send(x.grad, "B", s, s - 1, i)
        stats.timeline.append((op, start, time.perf_counter()))
    for handle, _ in sends:
        handle.wait()
    return stats


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0.002:
        time.sleep(remaining - 0.001)      # sleep most of it, spin the last millisecond
    while time.perf_counter() < deadline:
        pass


def measured_bubble(timelines: Sequence[Sequence[tuple]], schedule: str) -> float:
    """The bubble as calc.pipeline.bubble_fraction counts it, from measured timelines.

    The step runs from the first op's start to the last op's end on any stage;
    a stage's idle time is that span minus the time it spent in ops. The bubble
    is idle / busy for every schedule. Averaged over stages.
    """
    t0 = min(t[1] for row in timelines for t in row)
    t1 = max(t[2] for row in timelines for t in row)
    span = t1 - t0
    fractions = []
    for row in timelines:
        busy = sum(end - start for _, start, end in row)
        idle = span - busy
        fractions.append(idle / busy)
    return sum(fractions) / len(fractions)
