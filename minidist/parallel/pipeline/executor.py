"""Pipeline parallelism: run a schedule (schedule.py) in real processes.

Each rank of the pipeline group holds v model chunks (v = 1 unless interleaved);
chunk c of rank r is piece c p + r of the model. For every op of its schedule,
in order, a rank does:

    F(i, c)   receive x from the previous piece (unless first) -> y = chunk_c(x)
              -> send y to the next piece (unless last; the last piece returns
              micro-batch i's loss instead)
    B(i, c)   receive dL/dy from the next piece (unless last) -> backward through
              chunk_c -> send dL/dx to the previous piece (unless first)
    W(i, c)   (zero-bubble schedules) the weight gradients that B(i, c) left as
              closures (autograd.backward_split): B computed only dL/dx, the
              one thing the previous piece waits for
    F&B       (dualpipe_v) receive both inputs, F of one chunk and send its
              output, B and W of the other and send its gradient: one op, whose
              two halves take turns at each MoE all-to-all (below)

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

In an F&B the forward half hands the turn to the backward half at each expert all-to-all
it starts, and back (comm/collectives/interleave.py): one micro-batch's dispatch and
combine travel while the other's attention and MLP compute (DeepSeek-V3's overlap), one
half running at a time, so the result is forward-then-backward's bit for bit.

Two consecutive pieces on one rank (the V placement of zb_v and dualpipe_v: the last
rank holds pieces p - 1 and p) hand their activation and gradient over in memory, as
torch's stages on one rank do (``set_local_fwd_input``): a copy, no message. Per
micro-batch a rank sends one message per link to a neighbouring piece on another rank:
1F1B one (rank 0 an activation, the last rank a gradient) or two (the others); the V
schedules twice that (two pieces a rank, 2p - 1 cuts instead of p - 1), every message
an activation's size: at p = 2, 2m messages a rank against 1F1B's m.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import minidist.distributed as dist
from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.autograd.weight_grad import backward_split
from minidist.backend import xp
from minidist.comm.collectives.interleave import Turns
from minidist.distributed.tensor._piece_norm import note_stage
from minidist.nn.module import Module
from minidist.parallel.pipeline.clock import OpClock
from minidist.parallel.pipeline.op import (Op, Overlap, op_label, plain_ops, rank_and_chunk,
                                           virtual_stage)
from minidist.trace import recorder as trace

_TAG_BASE = 1 << 20   # pipeline tags: base + ((kind P + sending piece) m + micro-batch)
_KINDS = ("F", "B", "F clock", "B clock")   # activations, gradients, their send times


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
    peak_inflight: int = 0                            # most micro-batch chunks held at once
    peak_w_bytes: int = 0                             # most bytes W closures held at once


class Neighbours:
    """The messages of one rank's pipeline ops: activations forward ("F"),
    gradients back ("B"), each with one tag per (kind, sending piece,
    micro-batch), so that arrival order does not matter. With a logical clock
    (clock.py) each message's send time travels beside it."""

    def __init__(self, group: Any, pieces: int, microbatches: int, placement: str,
                 shape: tuple, dtype: Any, clock: OpClock):
        self.group, self.pieces, self.m, self.placement = group, pieces, microbatches, placement
        self.p = dist.get_world_size(group)
        self.shape, self.dtype, self.clock = shape, dtype, clock
        self.sends: list = []    # pending isends; their arrays must live until waited on
        self.me = dist.get_rank()    # global rank: pieces held here hand over in memory
        self.local: dict = {}    # (kind, sender, mb) -> (array, clock stamp) for a piece here

    def _tag(self, kind: str, sender: int, mb: int) -> int:
        return _TAG_BASE + (_KINDS.index(kind) * self.pieces + sender) * self.m + mb

    def _rank_of(self, piece: int) -> int:
        """The global rank that holds ``piece``."""
        r = rank_and_chunk(piece, self.p, self.placement)[0]
        return r if self.group is None else self.group.ranks[r]

    def receive(self, kind: str, sender: int, mb: int) -> Any:
        """Micro-batch ``mb``'s activation ("F") or gradient ("B") from piece ``sender``."""
        if self._rank_of(sender) == self.me:           # a piece of this rank: in memory
            buf, sent_at = self.local.pop((kind, sender, mb))
            if self.clock.logical:
                self.clock.arrived(sent_at)
            return buf
        buf = xp.empty(self.shape, dtype=self.dtype)
        dist.recv(buf, self._rank_of(sender), self.group, self._tag(kind, sender, mb))
        if self.clock.logical:
            stamp = xp.empty(1, dtype="float64")
            dist.recv(stamp, self._rank_of(sender), self.group,
                      self._tag(kind + " clock", sender, mb))
            self.clock.arrived(float(backend.to_host(stamp)[0]))
        return buf

    def send(self, arr: Any, kind: str, sender: int, receiver: int, mb: int) -> None:
        """Start sending ``arr`` from piece ``sender`` to piece ``receiver``."""
        arr = xp.ascontiguousarray(arr)
        dst = self._rank_of(receiver)
        if dst == self.me:                 # a copy, as the receive buffer would have been
            if tuple(arr.shape) != tuple(self.shape):
                raise ValueError(f"piece {sender} passes piece {receiver} an array of shape "
                                 f"{tuple(arr.shape)}; activation_shape is {tuple(self.shape)}")
            stamp = self.clock.stamp() if self.clock.logical else 0.0
            self.local[(kind, sender, mb)] = (arr.astype(self.dtype, copy=True), stamp)
            return
        self.sends.append((dist.isend(arr, dst, self.group, self._tag(kind, sender, mb)), arr))
        if self.clock.logical:
            stamp = backend.from_host([self.clock.stamp()], "float64")
            self.sends.append((dist.isend(stamp, dst, self.group,
                                          self._tag(kind + " clock", sender, mb)), stamp))

    def wait(self) -> None:
        """Wait until every send has left."""
        for handle, _ in self.sends:
            handle.wait()


def run_pipeline(ops: Sequence[Op], chunks: Sequence[Module], microbatches: int,
                 inputs: Sequence | None, targets: Sequence | None, *,
                 activation_shape: tuple, dtype: Any, group: Any = None,
                 op_seconds: tuple | None = None, op_costs: tuple | None = None,
                 placement: str = "loop", interleave: bool = True) -> PipelineStats:
    """Run this rank's ``ops`` over its ``chunks`` (v modules) for one step.

    inputs / targets: the m micro-batches, arrays of the backend (needed by the ranks
    holding the first / last piece; others may pass None). The first piece is called as chunk(ids),
    the last as chunk(x, targets) -> scalar loss, the others as chunk(x) -> y.
    ``activation_shape`` / ``dtype``: of every tensor passed between pieces.
    ``op_seconds`` = (forward, backward[, weight]): make every op last at least
    that long (1/v of it per chunk op), so that measured bubbles compare with
    formulas for equal-cost stages; where the schedule has W ops, W takes
    ``weight`` of the backward (default half) and B the rest (op.op_cost).
    ``op_costs``, the same shape: record a logical clock instead of seconds
    (clock.py). ``placement``: "loop", or "v" for zb_v (schedule.placement).
    ``interleave``: an F&B's halves take turns at each all-to-all (module docstring);
    False: its forward, then its backward.
    Gradients accumulate into the chunks' parameters, one stage's of ``group``.
    """
    p, r = dist.get_world_size(group), dist.get_rank(group)
    note_stage([q for c in chunks for q in c.parameters()], group)   # GradScaler: all skip
    split = any(op.kind == "W" for op in plain_ops(ops))
    clock = OpClock(op_seconds, op_costs, split, len(chunks))
    link = Neighbours(group, p * len(chunks), microbatches, placement, activation_shape,
                      dtype, clock)
    run = _StepRun(chunks, microbatches, inputs, targets, link, split, interleave)
    traced = trace.active is not None and op_costs is None   # op spans in a trace (trace/)
    step = trace.active.next_step("pipeline") if traced else 0
    for op in ops:
        if isinstance(op, Overlap):                     # F&B: two pieces in one op
            run.overlapped(op, virtual_stage(r, op.forward.chunk, p, placement),
                           virtual_stage(r, op.backward.chunk, p, placement))
        else:
            _run_op(run, op, virtual_stage(r, op.chunk, p, placement))
        if traced:
            trace_op(*clock.timeline[-1], step, group, p)
    link.wait()
    return run.stats


def _run_op(run: "_StepRun", op: Op, s: int) -> None:
    """One F, B or W of piece ``s`` (this op's place in the model)."""
    if op.kind == "F":
        run.forward(op, s)
    elif op.kind == "B":
        run.backward(op, s)
    else:
        run.weight(op)


class _StepRun:
    """One rank's step of the pipeline: its three kinds of op, and what they leave for
    each other (a micro-batch's input and output from F to B, its weight gradients from
    B to W)."""

    def __init__(self, chunks: Sequence[Module], microbatches: int, inputs: Sequence | None,
                 targets: Sequence | None, link: Neighbours, split: bool, interleave: bool):
        self.chunks, self.m, self.inputs, self.targets = chunks, microbatches, inputs, targets
        self.link, self.clock, self.split = link, link.clock, split
        self.interleave = interleave      # F&B's halves take turns (interleave.py)
        self.last_piece = link.pieces - 1
        self.stats = PipelineStats(timeline=link.clock.timeline)
        self.saved: dict[tuple[int, int], tuple[Tensor | None, Tensor]] = {}  # (mb, chunk) -> (x, y)
        self.w_todo: dict[tuple[int, int], Any] = {}   # (mb, chunk) -> its WeightGradients
        self.weights = [list(chunk.parameters()) for chunk in chunks]

    def forward(self, op: Op, s: int) -> None:
        """F: receive x (unless the first piece), y = chunk(x), send y (or keep the loss)."""
        x = self.forward_input(op, s)
        self.clock.begin(op)
        out = self.forward_compute(op, s, x)
        self.clock.end(op)
        self.forward_output(op, s, out)

    def backward(self, op: Op, s: int) -> None:
        """B: receive dL/dy (the last piece: 1/m), backpropagate, send dL/dx back (unless
        the first piece); with W ops, only dL/dx now and the weights' gradients kept."""
        grad = self.backward_input(op, s)
        self.clock.begin(op)
        x = self.backward_compute(op, grad)
        self.clock.end(op)
        self.backward_output(op, s, x)

    def weight(self, op: Op) -> None:
        """W: the weight gradients B left for this micro-batch and chunk."""
        self.clock.begin(op)
        self.w_todo.pop((op.microbatch, op.chunk)).run()
        self.clock.end(op)

    def overlapped(self, op: Overlap, s_f: int, s_b: int) -> None:
        """F&B: both inputs received; the forward computed and its output sent
        (``isend``: it travels while the backward computes), the backward and its W
        (the two halves taking turns at each all-to-all), and its gradient sent."""
        x = self.forward_input(op.forward, s_f)
        grad = self.backward_input(op.backward, s_b)
        done: dict = {}                          # the backward half's x, whose .grad is dL/dx

        def forward_half() -> None:
            self.forward_output(op.forward, s_f, self.forward_compute(op.forward, s_f, x))

        def backward_half() -> None:
            done["x"] = self.backward_compute(op.backward, grad)
            self.w_todo.pop((op.backward.microbatch, op.backward.chunk)).run()
        self.clock.begin(op)
        if self.interleave:        # names and args of the halves' spans in a trace
            Turns(*op.trace_labels()).run(forward_half, backward_half)
        else:
            forward_half()
            backward_half()
        self.clock.end(op)
        self.backward_output(op.backward, s_b, done["x"])

    def forward_input(self, op: Op, s: int) -> Tensor | None:
        """The activation from the previous piece (None on the first piece)."""
        if s == 0:
            return None
        return Tensor(self.link.receive("F", s - 1, op.microbatch), requires_grad=True)

    def forward_compute(self, op: Op, s: int, x: Tensor | None) -> Tensor:
        """y = chunk(x), or the loss on the last piece; x and y kept for B."""
        i = op.microbatch
        chunk = self.chunks[op.chunk]
        if s == self.last_piece:
            out = chunk(self.inputs[i] if s == 0 else x, self.targets[i])
        else:
            out = chunk(self.inputs[i] if s == 0 else x)
        self.saved[(i, op.chunk)] = (x, out)
        held = len(self.saved) + len(self.w_todo)
        self.stats.peak_inflight = max(self.stats.peak_inflight, held)
        return out

    def forward_output(self, op: Op, s: int, out: Tensor) -> None:
        """Send y on (or keep the loss, on the last piece)."""
        if s == self.last_piece:
            self.stats.losses.append(float(out.data))
        else:
            self.link.send(out.data, "F", s, s + 1, op.microbatch)

    def backward_input(self, op: Op, s: int) -> Any:
        """dL/dy from the next piece; on the last piece d(mean)/d(loss_i) = 1/m."""
        if s == self.last_piece:
            out = self.saved[(op.microbatch, op.chunk)][1]
            return xp.full(out.shape, 1.0 / self.m, dtype=out.dtype)
        return self.link.receive("B", s + 1, op.microbatch)

    def backward_compute(self, op: Op, grad: Any) -> Tensor | None:
        """Backpropagate dL/dy through the chunk; returns x, whose .grad is dL/dx.
        With W ops, the weights' gradients are kept for W (autograd.backward_split)."""
        key = (op.microbatch, op.chunk)
        x, out = self.saved.pop(key)
        if self.split:       # dL/dx now; the weights' gradients wait for W
            self.w_todo[key] = backward_split(out, grad, weights=self.weights[op.chunk])
            held = sum(w.held_bytes for w in self.w_todo.values())
            self.stats.peak_w_bytes = max(self.stats.peak_w_bytes, held)
        else:
            out.backward(grad)
        return x

    def backward_output(self, op: Op, s: int, x: Tensor | None) -> None:
        """Send dL/dx back (unless the first piece)."""
        if s != 0:
            self.link.send(x.grad, "B", s, s - 1, op.microbatch)


def trace_op(op: Op | Overlap, start: float, end: float, step: int, group: Any,
             p: int) -> None:
    """The op as a span of the trace (the same start and end as ``stats.timeline``,
    so the trace's bubble is ``measured_bubble``'s: trace/summary.py). An F&B is
    one span, named and numbered after its forward half."""
    ranks = list(range(p)) if group is None else list(group.ranks)
    first = op.forward if isinstance(op, Overlap) else op
    name = op_label(first)
    if isinstance(op, Overlap):
        name += " & " + op_label(op.backward)
    trace.active.span(name, "pipeline", start, end, dict(
        kind=op.kind, microbatch=first.microbatch, chunk=first.chunk, step=step, group=ranks))


def measured_bubble(timelines: Sequence[Sequence[tuple]]) -> float:
    """The bubble, idle time over ideal compute time (calc.pipeline's convention),
    from the (op, start, end) of every op of every stage, measured or simulated.

    A stage's idle time is the time between its first op's start and its last
    op's end that it spent in no op. The step's bubble is the largest over the
    stages: with each stage stepping its optimizer once its own last op is done,
    the next step follows each stage's own span, and the busiest span sets the
    pace. (For GPipe, 1F1B and interleaved, stage 0 starts first and ends last,
    so this is the idle time of the whole step; zero-bubble schedules end on
    later stages later, a parallelogram, and count only their own span.)
    """
    worst = 0.0
    for row in timelines:
        busy = sum(end - start for _, start, end in row)
        span = max(end for _, _, end in row) - min(start for _, start, _ in row)
        worst = max(worst, (span - busy) / busy)
    return worst
