"""The communication of expert parallelism: all-to-all as an autograd op.

Rank i sends S[i][j] rows to rank j (``all_to_all_single`` with uneven splits). Row a
of the output depends only on one row of one rank's input, so the gradient of the
output goes back along the same path, reversed: the all-to-all with the split matrix
transposed (what rank j received from i, j now sends to i).

    forward:   y = A2A_S(x)            send splits S[r][:], receive splits S[:][r]
    backward:  dx = A2A_{S^T}(dy)      send splits S[:][r], receive splits S[r][:]

Overlapped (``all_to_all_start`` then ``all_to_all_wait``): the all-to-all runs in the
background (``all_to_all_single(..., async_op=True)``, a ``Work``) while the caller
computes what does not need its rows (the shared expert); the wait hands on the rows.
The same bytes land in the same places, so the result is the plain one bit for bit.

Inside DualPipeV's F&B op (the forward of one micro-batch and the backward of another
taking turns, comm/collectives/interleave.py) every all-to-all of rows, forward and
backward, starts in the background and hands the turn to the other micro-batch's half,
whose attention and MLP compute while the rows travel (DeepSeek-V3, section 3.2.1):
``_exchange``. Outside such a pair it is the plain blocking call.

The receiver does not know S[:][r] in advance (it depends on the router's choices
on every rank), so ``exchange_counts`` sends it first: an all-to-all of E/ep counts
per destination, one per expert of that rank.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import to_host, xp
from minidist.comm.collectives import interleave


def exchange_counts(counts: Any, group: Any) -> Any:
    """counts (E,) of rows this rank sends to each expert -> (ep, E/ep): row i holds
    how many rows rank i sends to each of this rank's experts."""
    ep = dist.get_world_size(group)
    out = xp.empty_like(counts)
    dist.all_to_all_single(out, xp.ascontiguousarray(counts), group=group)
    return out.reshape(ep, -1)


def _exchange(x: Any, send_splits: list[int], recv_splits: list[int], group: Any) -> Any:
    """all_to_all_single of the rows of ``x``: blocking, or, in one half of an F&B pair
    (``interleave.paired()``), in the background while the other half has its turn."""
    out = xp.empty((sum(recv_splits),) + tuple(x.shape[1:]), dtype=x.dtype)
    x = xp.ascontiguousarray(x)
    if not interleave.paired():
        dist.all_to_all_single(out, x, recv_splits, send_splits, group=group)
        return out
    work = dist.all_to_all_single(out, x, recv_splits, send_splits, group=group,
                                  async_op=True)
    interleave.hand_over(work)
    return out


class AllToAll(Function):
    """all_to_all_single along axis 0; backward with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _exchange(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        return _exchange(grad, recv_splits, send_splits, ctx.group), None, None, None


class InFlight:
    """One all-to-all on the wire: its ``Work`` (None once waited for)."""

    def __init__(self):
        self.work = None


class AllToAllStart(Function):
    """Issue the all-to-all in the background; its output buffer comes back at once and
    must not be read before ``AllToAllWait`` (backward: the plain transposed all-to-all)."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, flight):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = xp.empty((sum(recv_splits),) + tuple(x.shape[1:]), dtype=x.dtype)
        flight.work = dist.all_to_all_single(out, xp.ascontiguousarray(x), recv_splits,
                                             send_splits, group=group, async_op=True)
        return out

    @staticmethod
    def backward(ctx, grad):
        return AllToAll.backward(ctx, grad)[:4] + (None,)


class AllToAllWait(Function):
    """Wait for the all-to-all in ``flight``; its rows, unchanged (backward: identity)."""

    @staticmethod
    def forward(ctx, out, flight):
        interleave.hand_over(flight.work)     # in an F&B pair, the other half's turn first
        flight.work = None
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def all_to_all_start(x: Tensor, send_splits: list[int], recv_splits: list[int],
                     group: Any = None) -> tuple[Tensor, InFlight]:
    """Start ``all_to_all``: (the rows' buffer, not to be read yet, and the call in flight)."""
    flight = InFlight()
    out = AllToAllStart.apply(x, list(send_splits), list(recv_splits), group, flight)
    return out, flight


def all_to_all_wait(out: Tensor, flight: InFlight) -> Tensor:
    """The rows of the all-to-all started by ``all_to_all_start``, once they have landed."""
    return AllToAllWait.apply(out, flight)


def all_to_all(x: Tensor, send_splits: list[int], recv_splits: list[int],
               group: Any = None) -> Tensor:
    """Rows of ``x`` (cut by ``send_splits``) to the ranks of ``group``; differentiable."""
    return AllToAll.apply(x, list(send_splits), list(recv_splits), group)


def host_ints(a: Any) -> list[int]:
    """A small device array of counts as Python ints (one explicit transfer)."""
    return [int(v) for v in to_host(a).reshape(-1).tolist()]
