"""The local transport: point-to-point messages through shared memory.

Every ordered pair of ranks (src, dst) owns a channel in the world's segment
(layout in shm.py): a ring of ``nslots`` slots of ``slot_bytes`` each. A message
is cut into pieces of at most ``slot_bytes``; each piece carries a small header
(tag, message size, offset, piece size, dtype), so a message larger than a
slot streams through the ring while the receiver drains it: sending and
receiving are pipelined.

Array bytes never go through pickle: the sender copies them into the slot, the
receiver copies them out (``recv``) or adds them straight from the slot into
its own buffer (``irecv(..., op=SUM)``, the fused receive-and-reduce that the
ring all-reduce is made of: one read of the slot, no temporary).

Nothing blocks: ``isend`` / ``irecv`` post an operation, and ``wait_all`` runs
the progress loop, which pushes pieces of every pending send while there are
free slots and pulls pieces of every pending receive. When a pass moves
nothing, the rank keeps polling for up to ``SPIN_S`` seconds, yielding the CPU
between polls (``sched_yield``: free when nobody else wants the core, and it
lets a peer that shares our core run, with more ranks than cores or other
load on the machine), then sleeps on its doorbell until a peer rings it
(doorbell.py): peers ring after every piece they publish or slot they free.
Sleeping costs a wake-up (a few to tens of microseconds, more in a VM), so it
is kept for long waits: a peer that is computing, not communicating. So a rank may post a
send to its right neighbour and a receive from its left one and wait for both,
whatever the message size, without deadlock. A message that arrives before its
receive is posted is kept in a side buffer (the "unexpected" queue), but only
when a receive with another tag is waiting behind it on the same channel.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from minidist import backend
from minidist.comm import shm
from minidist.comm.doorbell import Doorbells
from minidist.comm.errors import CommTimeoutError, MessageMismatchError, WorldAbortedError
from minidist.comm.ops import ReduceOp, combine_fn
from minidist.comm.transport import (Handle, Transport, cores_available, dtype_code,
                                     dtype_name, flat_target, host_bytes, host_view, sched_yield)

TAG_BITS = 32  # a wire tag is (group context << 32) | tag
SPIN_S = 0.002  # how long a rank polls before it sleeps on its doorbell


def describe_tag(wire_tag: int) -> str:
    ctx, tag = divmod(wire_tag, 1 << TAG_BITS)
    return f"tag {tag}" + (f" in group context {ctx}" if ctx else "")


class _Send(Handle):
    __slots__ = ("transport", "dst", "tag", "data", "total", "sent", "code", "done")

    def __init__(self, transport, dst, tag, data, code):
        self.transport, self.dst, self.tag, self.code = transport, dst, tag, code
        self.data, self.total, self.sent, self.done = data, data.size, 0, False

    def wait(self, timeout: float | None = None) -> None:
        self.transport.wait_all([self], timeout)

    def describe(self) -> str:
        return f"send to rank {self.dst} ({describe_tag(self.tag)}, {self.sent}/{self.total} bytes)"


class _Recv(Handle):
    __slots__ = ("transport", "src", "tag", "flat", "dtype", "code", "total", "got",
                 "combine", "copy_back", "done")

    def __init__(self, transport, src, tag, arr, op):
        self.transport, self.src, self.tag = transport, src, tag
        self.flat, self.copy_back = flat_target(arr)
        self.dtype, self.code = arr.dtype, dtype_code(arr.dtype)
        self.total, self.got, self.done = arr.nbytes, 0, False
        self.combine = None if op is None else combine_fn(op)

    def wait(self, timeout: float | None = None) -> None:
        self.transport.wait_all([self], timeout)

    def describe(self) -> str:
        return f"recv from rank {self.src} ({describe_tag(self.tag)}, {self.got}/{self.total} bytes)"

    def check(self, total: int, code: int) -> None:
        if total != self.total or code != self.code:
            raise MessageMismatchError(
                f"rank {self.transport.rank}: the message from rank {self.src} "
                f"({describe_tag(self.tag)}) holds {total} bytes of {dtype_name(code)}, "
                f"but the receive posted for it expects {self.total} bytes of {self.dtype.str}")

    def accept(self, piece: Any, offset: int) -> None:
        """Write (or reduce) one piece of host bytes at byte ``offset`` of the target."""
        n = piece.size
        if n == 0:
            return
        incoming = backend.from_host(piece.view(self.dtype))
        lo = offset // self.dtype.itemsize
        dst = self.flat[lo:lo + incoming.size]
        if self.combine is None:
            dst[...] = incoming
        else:
            self.combine(dst, incoming, out=dst)  # the fused receive-and-reduce
        self.got += n

    def complete(self) -> None:
        if self.copy_back is not None:
            self.copy_back()
        self.done = True


class _Unexpected:
    """A message that arrived before a matching receive was posted."""
    __slots__ = ("tag", "total", "code", "buf", "got", "claimed_by")

    def __init__(self, tag, total, code):
        self.tag, self.total, self.code, self.got = tag, total, code, 0
        self.buf = host_view(bytearray(total))
        self.claimed_by = None

    def accept(self, piece: Any, offset: int) -> None:
        self.buf[offset:offset + piece.size] = piece
        self.got += piece.size


class _Channel:
    """Word indices and slot views of one direction of one pair."""
    __slots__ = ("head_i", "tail_i", "hdr_i", "payload", "count")

    def __init__(self, words, data, offset, nslots, slot_bytes):
        self.head_i = offset // 8
        self.tail_i = (offset + 64) // 8
        slots = [offset + shm.CHANNEL_HEADER_BYTES + k * (shm.SLOT_HEADER_BYTES + slot_bytes)
                 for k in range(nslots)]
        self.hdr_i = [s // 8 for s in slots]
        self.payload = [data[s + shm.SLOT_HEADER_BYTES:s + shm.SLOT_HEADER_BYTES + slot_bytes]
                        for s in slots]
        self.count = 0  # pieces written (outgoing) or consumed (incoming) by this rank


class LocalTransport(Transport):
    """Point-to-point between the processes of one machine, through shared memory."""

    name = "shm"

    def __init__(self, segment_name: str, rank: int, timeout: float = 60.0):
        self.segment_name = segment_name
        self._seg = shm.attach(segment_name)
        self.world_size, self.nslots, self.slot_bytes = shm.read_header(self._seg)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        self.rank, self.timeout = rank, timeout
        # More ranks than cores: yield at once when a poll finds nothing.
        self.free_polls = 1 if self.world_size > cores_available() else 32
        self._words = self._seg.buf.cast("q")
        self._bells = Doorbells(self._seg.buf, shm.BELLS_OFFSET, self.world_size)
        data = host_view(self._seg.buf)
        n, k, s = self.world_size, self.nslots, self.slot_bytes
        self._out = [_Channel(self._words, data, shm.channel_offset(rank, d, n, k, s), k, s)
                     for d in range(n)]
        self._in = [_Channel(self._words, data, shm.channel_offset(src, rank, n, k, s), k, s)
                    for src in range(n)]
        self._sends: dict[int, deque] = {}       # dst -> sends in order
        self._posted: dict[int, list] = {}       # src -> receives not yet matched
        self._current: dict[int, Any] = {}       # src -> receive that is taking pieces now
        self._unexpected: dict[int, list] = {}   # src -> messages stashed early
        self._lock = threading.RLock()
        self._next_ctx = 1

    # -- posting -------------------------------------------------------------
    def isend(self, arr: Any, dst: int, tag: int, ctx: int = 0) -> Handle:
        op = _Send(self, dst, (ctx << TAG_BITS) | tag, host_bytes(arr), dtype_code(arr.dtype))
        with self._lock:
            queue = self._sends.setdefault(dst, deque())
            queue.append(op)
            if len(queue) == 1:  # nothing ahead of it: send eagerly what fits now
                while not op.done and self._push(dst, op):
                    pass
                if op.done:
                    queue.popleft()
                    del self._sends[dst]
        return op

    def irecv(self, arr: Any, src: int, tag: int, ctx: int = 0,
              op: ReduceOp | None = None) -> Handle:
        r = _Recv(self, src, (ctx << TAG_BITS) | tag, arr, op)
        with self._lock:
            for i, early in enumerate(self._unexpected.get(src, ())):
                if early.tag == r.tag and early.claimed_by is None:
                    r.check(early.total, early.code)
                    if early.got == early.total:  # complete: deliver now
                        del self._unexpected[src][i]
                        r.accept(early.buf, 0)
                        r.complete()
                    else:                          # still arriving: deliver when done
                        early.claimed_by = r
                    return r
            self._posted.setdefault(src, []).append(r)
            while self._pull(src):
                pass
        return r

    # -- progress ------------------------------------------------------------
    def _push(self, dst: int, op: _Send) -> bool:
        """Write the next piece of ``op`` into a free slot; False if none is free."""
        ch, w = self._out[dst], self._words
        if ch.count - w[ch.tail_i] >= self.nslots:
            return False
        k = ch.count % self.nslots
        n = min(self.slot_bytes, op.total - op.sent)
        if n:
            ch.payload[k][:n] = op.data[op.sent:op.sent + n]
        h = ch.hdr_i[k]
        w[h], w[h + 1], w[h + 2], w[h + 3], w[h + 4] = op.tag, op.total, op.sent, n, op.code
        op.sent += n
        ch.count += 1
        w[ch.head_i] = ch.count  # publish: the piece is complete
        self._bells.ring(dst)
        if op.sent >= op.total:
            op.done = True
        return True

    def _pull(self, src: int) -> bool:
        """Consume the next piece from ``src`` if it has a destination."""
        ch, w = self._in[src], self._words
        if w[ch.head_i] == ch.count:
            return False
        h = ch.hdr_i[ch.count % self.nslots]
        target = self._current.get(src)
        if target is None:
            target = self._match(src, w[h], w[h + 1], w[h + 4])
            if target is None:
                return False  # nobody is receiving from src: leave it in the channel
            self._current[src] = target
        n = w[h + 3]
        target.accept(ch.payload[ch.count % self.nslots][:n], w[h + 2])
        ch.count += 1
        w[ch.tail_i] = ch.count  # free the slot
        self._bells.ring(src)
        if target.got >= target.total:
            del self._current[src]
            self._complete(src, target)
        return True

    def _match(self, src: int, tag: int, total: int, code: int):
        posted = self._posted.get(src)
        if not posted:
            return None
        for i, r in enumerate(posted):
            if r.tag == tag:
                del posted[i]
                if not posted:
                    del self._posted[src]
                r.check(total, code)
                return r
        # A receive for another tag is waiting behind this message: stash it.
        early = _Unexpected(tag, total, code)
        self._unexpected.setdefault(src, []).append(early)
        return early

    def _complete(self, src: int, target) -> None:
        if isinstance(target, _Recv):
            target.complete()
        elif target.claimed_by is not None:
            self._unexpected[src].remove(target)
            target.claimed_by.accept(target.buf, 0)
            target.claimed_by.complete()

    def _progress(self) -> bool:
        moved = False
        for dst in list(self._sends):
            queue = self._sends[dst]
            while queue and self._push(dst, queue[0]):
                moved = True
                if queue[0].done:
                    queue.popleft()
            if not queue:
                del self._sends[dst]
        for src in list(self._posted) + list(self._current):
            while self._pull(src):
                moved = True
        return moved

    def wait_all(self, handles: list, timeout: float | None = None, what: str = "",
                 abortable: bool = True) -> None:
        timeout = self.timeout if timeout is None else timeout
        polls, idle_since = 0, None
        while True:
            with self._lock:
                moved = self._progress()
            if all(h.done for h in handles):
                return
            if moved:
                polls, idle_since = 0, None
                continue
            polls += 1
            if polls >= self.free_polls:
                sched_yield()
            if polls % 32:
                continue  # look at the clock only now and then
            now = time.monotonic()
            if idle_since is None:
                idle_since = now
            if now - idle_since < SPIN_S:
                continue
            if abortable:
                self._check_abort()
            if now - idle_since > timeout:
                raise self._timeout_error(handles, timeout, what)
            self._sleep(handles)

    def _sleep(self, handles: list) -> None:
        """Sleep on our doorbell until a peer rings (at most 50 ms)."""
        bells, me = self._bells, self.rank
        seen = bells.value(me)
        with self._lock:
            bells.sleepers(me, +1)
        try:
            with self._lock:  # look once more, now that peers know we may sleep
                moved = self._progress()
            if not moved and not all(h.done for h in handles):
                bells.wait(me, seen, 0.05)
        finally:
            with self._lock:
                bells.sleepers(me, -1)

    def _check_abort(self) -> None:
        if self._words[shm.W_ABORT]:
            failed, msg = shm.abort_reason(self._seg)
            who = "the launcher" if failed < 0 else f"rank {failed}"
            raise WorldAbortedError(f"rank {self.rank}: stopping because {who} failed: {msg}")

    def _timeout_error(self, handles, timeout, what) -> CommTimeoutError:
        pending = [h.describe() for h in handles if not h.done]
        where = f" in {what}" if what else ""
        return CommTimeoutError(
            f"rank {self.rank}: waited {timeout:g} s{where} without progress on: "
            + "; ".join(pending))

    # -- groups and shutdown -------------------------------------------------
    def new_context(self, ranks: list[int]) -> int:
        ctx = self._next_ctx
        self._next_ctx += 1
        return ctx

    def abort(self, message: str) -> None:
        if self._seg is not None:
            shm.set_abort(self._seg, self.rank, message)

    def close(self) -> None:
        if self._seg is None:
            return
        self._out = self._in = []
        self._words.release()
        self._bells.close()
        seg, self._seg = self._seg, None
        shm.close(seg)
