"""Small all-reduce: gather every rank's array and reduce locally, in the same
exchange as the same-call check.

For a few kilobytes an all-reduce costs its rounds of messages (the alpha
term), not its bytes. The call check (check.py) already is an all-gather:
in ceil(log2 N) rounds of the Bruck pattern every rank collects one block from
every rank. Let each block carry, after the record describing the call, the
rank's array, and the check and the all-reduce are one exchange:

    block of rank q = [ record of q's call (128 B) | x_q (M bytes) ]

    round k, d = 2**k:  send rows 0..count-1 of my table to rank r - d,
                        receive count rows from rank r + d into rows d, d+1, ...
    then:  every record equals mine  ->  all ranks made the same call
           x = op(x_0, x_1, ..., x_{N-1}), folded in rank order

    T_allgather = ceil(log2 N) * alpha + (N-1) * M / beta,   (N-1) * M bytes sent

Every rank folds the same N arrays in the same order, so all get the same bits
(the bits of the one-process reference, which folds left to right, too).
Against recursive doubling after a separate check this halves the rounds (and
needs no extra fold/unfold steps when N is not a power of two), but sends
(N-1) M bytes instead of log2(N) M, so ``auto`` uses it for small arrays only
(all_reduce.py). With the check off (``init_process_group(check=False)``) the
blocks are the arrays alone, and a block of another size raises
MessageMismatchError where it arrives.

On one machine an array that fits a slot of the board takes the latency path
instead (oneshot.py): one post and N-1 reads in place, the same fold.

A call should cost little more than its messages, so everything that depends
only on (group, shape, dtype, op) is worked out once and kept in a plan: the
table, the views of its rows in rank order, the record, the fields of the
call for the stats. A call copies its array in, exchanges, compares, folds.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.comm.collectives import oneshot
from minidist.comm.collectives.check import CheckTable, cached_plan, describe
from minidist.comm.transport.reduce_op import ReduceOp, combine_fn, fold_in_order

# Only plans whose table is small are kept: every array that auto gathers off
# the board (N * M <= N/(N-1) * gather_bytes of all_reduce.THRESHOLDS: 512 KiB at
# world 2, 4 MiB at world 4, plus N records), not an explicit
# algorithm="allgather" on big arrays, which makes its plan afresh. A kept table
# saves making and zeroing it per call (17.5 us instead of 34 at 64 KiB, world 2),
# and the cache (check.py's cached_plan, at most MAX_PLANS per group) stays under
# 32 x 4 MiB (a loop all-reduces a few shapes: one table each).
MAX_KEPT_TABLE_BYTES = (4 << 20) + 8 * 1024


class SmallPlan:
    """What a small all-reduce of one (shape, dtype, op) on one group needs."""

    def __init__(self, group, shape: tuple, dtype: Any, op: ReduceOp):
        n, r = group.size, group.rank
        # The call, as the stats record it and the check compares it.
        self.fields = dict(op=op.name, algorithm="allgather", dtype=dtype.name, shape=shape)
        self.line = describe("all_reduce", **self.fields)
        count = 1
        for s in shape:
            count *= s
        self.payload_bytes = count * dtype.itemsize   # M
        # Row i: the block of rank r + i (mod N): [record | array bytes].
        self.check = CheckTable(group, self.line, self.payload_bytes, with_record=group.check)
        self.table = self.check.table
        arrays = self.check.payload.view(dtype)       # (N, count): row i = x of rank r + i
        self.mine = arrays[0]
        self.by_rank = [arrays[(q - r) % n] for q in range(n)]  # x_0, x_1, ..., x_{N-1}
        # On the CPU backends from_host gives a view: made once here. On CuPy it
        # copies to the device, so it must happen on every call.
        self.on_host = backend.get_backend() != "cupy"
        if self.on_host:
            self.by_rank = [backend.from_host(x) for x in self.by_rank]
        self.combine = combine_fn(op)
        self.op = op
        self.messages = len(self.check.rounds)        # ceil(log2 N)
        self.bytes_moved = (n - 1) * self.payload_bytes  # sent, and received, per rank


def _small_table(plan: SmallPlan) -> bool:
    return plan.table.nbytes <= MAX_KEPT_TABLE_BYTES


def plan_for(group, tensor: Any, op: ReduceOp):
    """The plan for an all-reduce of ``tensor`` with ``op`` on ``group``, made on
    first use: through the board where the array fits its slot (oneshot.py),
    else through the check's Bruck rounds (here)."""
    if oneshot.fits(group, tensor.nbytes):
        return cached_plan(group, ("board", tensor.shape, tensor.dtype, op), oneshot.OneShotPlan,
                           group, tensor.shape, tensor.dtype, op)
    return cached_plan(group, (tensor.shape, tensor.dtype, op), SmallPlan,
                       group, tensor.shape, tensor.dtype, op, keep=_small_table)


def allgather_all_reduce(group, flat: Any, plan: SmallPlan, tag: int) -> None:
    """Reduce the 1-D contiguous ``flat`` in place: gather every rank's copy with
    the call check, then fold them in rank order (formula in the module docstring)."""
    plan.mine[...] = backend.to_host(flat)        # our block's array part
    plan.check.gather(group, tag, "small all-reduce")  # raises on every rank on a mismatch
    stats = group.stats.counted   # counted as it moved (stats.py)
    stats.bytes_sent += plan.bytes_moved
    stats.bytes_recv += plan.bytes_moved
    stats.msgs_sent += plan.messages
    stats.msgs_recv += plan.messages
    xs = plan.by_rank if plan.on_host else [backend.from_host(x) for x in plan.by_rank]
    fold_in_order(xs, flat, plan.combine, plan.op)
