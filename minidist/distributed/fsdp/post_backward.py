"""The gradients' reduce-scatter left in flight: unit k's travels while unit k-1's backward computes.

FSDP2's post-backward (torch's ``FSDPParamGroup.post_backward``): once a unit's backward
has made its parameters' whole gradients, the unit issues their reduce-scatter on its own
stream and returns; the backward of the units before it computes while the gradients
travel, and the root waits for them all when the backward is done
(``_root_post_backward_final_callback``). Here the reduce-scatter is a collective on the
communication thread (comm/collectives/work.py), the one the prefetched gathers use, so
every rank keeps one order of collectives. A step of root + 2 blocks, backward::

    main thread  | b1: recompute, bwd | b0: recompute, bwd | root: bwd | end of backward |
    comm thread    [AG b0]             [RS b1 ~~~wire~~~]    [RS b0 ~~~]  [RS root ~~~]
                   issued before b1    issued when b1's       waited when b0 issues its
                   recomputes          backward is done       own; RS root at the end

Each unit's reduce is waited in the order of issue, at two moments:

    the next unit's post-backward, before it issues its own: at most one unit's whole
        gradients (the reduce-scatter's input, (n, W) side by side) are in flight while
        another unit computes; torch's default (``reduce_scatter_max_input_buffers = 1``:
        the compute stream waits for the previous reduce-scatter before the next copy-in)
    the end of the backward (the engine's ``queue_callback``): the last unit's (the
        root's), whose wait no compute can hide, as in FSDP2

Its pieces (in ``reduce_dtype``; HSDP: then averaged over the replicas, hsdp.py, in the
same chain on the communication thread) are cast to the parameter's dtype and kept until
the end of the backward, then written into each shard's ``.grad`` in the order of issue:
the pieces of one shard summed first (a unit that ran twice in one step), then added to
``.grad`` once, as the engine would have (autograd/engine.py's LeafGradients), so the
bits are those of a reduce-scatter that blocked. The optimizer, clip_grad_norm_ and
GradScaler read ``.grad`` after ``backward()`` returns, when every reduce is written.

A backward that raises writes none of its reduces: they are forgotten (the engine calls
``drop``; the communication thread still runs them, in their place in the order every
rank shares), so no stale gradient lands in a later step.
"""
from __future__ import annotations

import time
from typing import Any, NamedTuple

from minidist.autograd.engine import deliver, queue_callback
from minidist.nn.module import Parameter
from minidist.trace import recorder as trace


class PendingReduce(NamedTuple):
    """One unit's gradients under way (FSDP2's ReduceScatterState)."""
    shards: list[Parameter]      # the unit's pieces, whose .grad the reduce adds to
    scattered: Any               # ScatteredDim0: wait() gives the pieces, in reduce_dtype
    unit: int                    # the unit's place in the order of the forward (a trace's name)


class PostBackward:
    """The reduces of one model's backward (shared by its units, as their Schedule),
    in the order they were issued."""

    def __init__(self) -> None:
        self.in_flight: list[PendingReduce] = []   # issued, not yet waited
        self.done: list[tuple[Parameter, Any]] = []  # (shard, its piece), waited, not yet written
        self.queued = False                        # the end-of-backward callback is queued

    def issue(self, reduce: PendingReduce) -> None:
        """A unit's post-backward: leave its reduce under way until the next unit's (which
        calls ``wait_in_flight`` before it copies its gradients in) or the end."""
        self.in_flight.append(reduce)
        if not self.queued:
            self.queued = True
            queue_callback(self.finish, on_error=self.drop)

    def wait_in_flight(self) -> None:
        """Wait for the reduces under way, in the order of issue; keep their pieces. In a
        trace, a span ``FSDP reduce-scatter unit k`` on the main thread: how long the
        backward still waited for unit k's gradients."""
        for reduce in self.in_flight:
            start = time.perf_counter()
            pieces = reduce.scattered.wait()
            if trace.active is not None:
                trace.active.span(f"FSDP reduce-scatter unit {reduce.unit}", "zero", start,
                                  time.perf_counter(), {})
            self.done += [(shard, piece.astype(shard.dtype))
                          for shard, piece in zip(reduce.shards, pieces)]
        self.in_flight = []

    def finish(self) -> None:
        """The end of the backward: wait for the rest, then write every shard's gradient."""
        self.queued = False
        self.wait_in_flight()
        summed: dict[int, tuple[Parameter, Any]] = {}
        for shard, piece in self.done:           # issue order; a shard twice: summed first
            if id(shard) in summed:
                piece = summed[id(shard)][1] + piece
            summed[id(shard)] = (shard, piece)
        self.done = []
        for shard, piece in summed.values():
            deliver(shard, piece)

    def drop(self) -> None:
        """The backward raised: forget its reduces (not waited: a wait here could mask
        the error, or block on a peer that failed too)."""
        self.in_flight, self.done, self.queued = [], [], False


def refuse_missing_gradients(params: list, grads: list) -> None:
    """Raise if a trainable parameter of a unit that ran got no gradient (``grads[i]``
    None: the unit's forward did not use it). One process leaves such a parameter
    without ``.grad`` and the optimizer skips it; a zero gradient in its place would let
    AdamW move it (momentum, weight decay), and whether another rank used it is not
    known here. torch's FSDP2 reduces only the gradients that exist, which needs every
    rank to agree."""
    missing = [param.fqn for g, param in zip(grads, params)
               if g is None and param.shard.requires_grad]
    if missing:
        raise RuntimeError(f"fully_shard: these parameters of a unit that ran received no "
                           f"gradient: {missing}. A unit reduces all its parameters' "
                           "gradients together; give a module that may sit out a step its "
                           "own fully_shard unit (a unit that does not run reduces nothing), "
                           "or freeze what should not train (requires_grad=False)")
