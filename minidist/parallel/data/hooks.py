"""DDP communication hooks: what to send for a bucket of gradients, and how.

By default DDP all-reduces each bucket and divides by N. A communication hook
replaces that step, with the shape torch gives it::

    ddp.register_comm_hook(state, hook)      # once, before the first backward
    hook(state, bucket: GradBucket) -> Future # Future.wait() -> the averaged bucket

``bucket.buffer()`` is the flat float buffer of the bucket's gradients. The
hook starts its collectives with ``async_op=True`` while backward goes on, and
returns a ``Future`` whose ``wait()`` (called by DDP after backward) gives the
1-D array of averaged gradients, which DDP copies into the bucket if it is
another array. Three hooks are here, PowerSGD is in powersgd.py:

    allreduce_hook        all-reduce (AVG) in float32: 2(N-1)/N * 4n bytes per rank
                          (auto: the direct algorithm for buckets from 4 MiB)
    fp16_compress_hook    round to fp16, divide by N, all-reduce in fp16, widen:
                          half the bytes, 2(N-1)/N * 2n; the sum is rounded to fp16
                          at every addition, as in torch's hook on NCCL
    bf16_compress_hook    the same in bf16. NumPy has no bf16 type, so each rank
                          sends the 16-bit codes of its values (an all-gather,
                          (N-1) * 2n bytes per rank: fewer than the float32 ring
                          up to N = 4) and every rank adds them in rank order,
                          rounding to bf16 after each addition: the same bits
                          everywhere

``state`` is the group to reduce over (None: the world), as torch's default
hooks take the process group as their state.

The rounding is minidist's exact round-to-nearest-even (precision/rounding.py);
fp16 uses the backend's float16 type, whose conversion is the same IEEE rounding.
"""
from __future__ import annotations

from typing import Any, Callable

import minidist.distributed as dist
from minidist.backend import xp
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.precision import BF16, quantize


class GradBucket:
    """What a hook sees of one bucket (torch.distributed.GradBucket's methods)."""

    def __init__(self, bucket: Any, is_last: bool):
        self._bucket, self._is_last = bucket, is_last

    def buffer(self) -> Any:
        return self._bucket.flat          # (numel,) the gradients back to back

    def index(self) -> int:
        return self._bucket.index

    def is_last(self) -> bool:
        return self._is_last

    def parameters(self) -> list:
        return list(self._bucket.params)

    def gradients(self) -> list:
        return list(self._bucket.views)   # views of buffer(), one per parameter


class Future:
    """The pending result of a hook: collectives under way and what to do after.

    ``Future(work, then)``: ``wait()`` waits for ``work`` (a ``Work`` or None),
    then calls ``then()`` once; if that returns another Future, waits for it
    too. Its value is what ``wait()`` returns. ``works`` lists every collective
    it waited on, for the timeline (when communication started and ended).
    """

    def __init__(self, work: Any = None, then: Callable[[], Any] | None = None):
        self._work, self._then = work, then
        self._done, self._value = False, None
        self.works = [work] if work is not None else []

    def wait(self) -> Any:
        if not self._done:
            if self._work is not None:
                self._work.wait()
            value = self._then() if self._then is not None else None
            if isinstance(value, Future):
                value_future = value
                value = value_future.wait()
                self.works += value_future.works
            self._value, self._done = value, True
        return self._value

    def is_completed(self) -> bool:
        return self._done or (self._work is not None and self._work.is_completed()
                              and self._then is None)

    @property
    def started_at(self) -> float | None:
        times = [w.started_at for w in self.works if w.started_at is not None]
        return min(times) if times else None

    @property
    def finished_at(self) -> float | None:
        times = [w.finished_at for w in self.works if w.finished_at is not None]
        return max(times) if len(times) == len(self.works) and times else None


def allreduce_hook(group: Any, bucket: GradBucket) -> Future:
    """The default: average the bucket in place with one float32 all-reduce,
    chosen by size (``auto``): for buckets of 4 MiB and more the direct one (each
    byte copied once, the CPU free while bytes are on an emulated wire;
    comm/collectives/direct.py), or the ring where ranks cannot read each other."""
    buf = bucket.buffer()
    work = dist.all_reduce(buf, op=ReduceOp.AVG, group=group, async_op=True)
    return Future(work, lambda: buf)


def fp16_compress_hook(group: Any, bucket: GradBucket) -> Future:
    """Round to fp16, divide by N in fp16, all-reduce in fp16, copy back (torch's recipe)."""
    buf = bucket.buffer()
    n = dist.get_world_size(group)
    compressed = buf.astype(xp.float16)           # (numel,) IEEE round to nearest even
    xp.divide(compressed, n, out=compressed)      # rounded to fp16 again
    work = dist.all_reduce(compressed, group=group, async_op=True)

    def decompress() -> Any:
        buf[...] = compressed
        return buf
    return Future(work, decompress)


def bf16_codes(x: Any) -> Any:
    """The 16-bit bf16 codes of ``x`` (float32), rounded to nearest even: a bf16
    value is a float32 whose low 16 bits are zero, so its code is the top half."""
    rounded = quantize(x.astype(xp.float32), BF16)
    return (rounded.view(xp.uint32) >> 16).astype(xp.uint16)


def bf16_values(codes: Any) -> Any:
    """The float32 values of bf16 codes (exact)."""
    return (codes.astype(xp.uint32) << 16).view(xp.float32)


def bf16_compress_hook(group: Any, bucket: GradBucket) -> Future:
    """Round to bf16, divide by N, gather every rank's 16-bit codes and add them in
    rank order, rounding to bf16 after each addition (see the module docstring)."""
    buf = bucket.buffer()
    n = dist.get_world_size(group)
    scaled = quantize(bf16_values(bf16_codes(buf)) / xp.float32(n), BF16)
    mine = bf16_codes(scaled)                                    # (numel,) uint16
    gathered = xp.empty(n * mine.size, dtype=xp.uint16)          # (N * numel,)
    work = dist.all_gather_into_tensor(gathered, mine, group=group, async_op=True)

    def add_in_rank_order() -> Any:
        parts = gathered.reshape(n, mine.size)
        total = bf16_values(parts[0])
        for r in range(1, n):
            total = quantize(total + bf16_values(parts[r]), BF16)
        buf[...] = total
        return buf
    return Future(work, add_in_rank_order)
