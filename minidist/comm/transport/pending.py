"""Pending operations of the local transport, and where an incoming piece lands.

A ``Send`` holds the host bytes of the array being sent and how far it got; a
``Recv`` holds the flat view of the caller's array and writes each piece that
arrives at its offset, or folds it in with the reduction op (``accept``): on
the CPU backends the piece is read straight from shared memory, without a
temporary. A ``BytesRecv`` receives raw host bytes for the call check's
exchange (collectives/check.py), where a message of another size is a finding, not an
error: it is drained and dropped, and ``mismatch`` is set. An ``Unexpected``
message arrived before its receive was posted and waits in a private buffer. A ``Channel`` knows where one direction of one pair
of ranks lives in the segment (shm.py).
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.comm.transport import shm
from minidist.comm.errors import MessageMismatchError
from minidist.comm.transport.reduce_op import combine_fn
from minidist.comm.transport.base import Handle, dtype_code, dtype_name, flat_target, host_view

TAG_BITS = 32  # a wire tag is (group context << 32) | tag
# Pieces up to this size are copied through memoryviews (a third of NumPy's
# overhead per call); larger ones through NumPy, which releases the GIL while it
# copies, so that a collective running in the background overlaps computation.
SMALL_COPY = 16 * 1024


def describe_tag(wire_tag: int) -> str:
    ctx, tag = divmod(wire_tag, 1 << TAG_BITS)
    return f"tag {tag}" + (f" in group context {ctx}" if ctx else "")


class Send(Handle):
    """A message being cut into pieces and written into the channel to ``dst``."""

    __slots__ = ("transport", "dst", "tag", "data", "total", "sent", "code", "done")

    def __init__(self, transport, dst, tag, data, code):
        self.transport, self.dst, self.tag, self.code = transport, dst, tag, code
        self.data, self.total, self.sent, self.done = data, data.size, 0, False

    def wait(self, timeout: float | None = None) -> None:
        self.transport.wait_handle(self, timeout)

    def describe(self) -> str:
        return f"send to rank {self.dst} ({describe_tag(self.tag)}, {self.sent}/{self.total} bytes)"

    def peer(self) -> int:
        return self.dst


class Recv(Handle):
    """A receive into (or, with ``op``, a reduction into) the caller's array."""

    __slots__ = ("transport", "src", "tag", "flat", "dtype", "code", "total", "got",
                 "combine", "copy_back", "done")

    def __init__(self, transport, src, tag, arr, op):
        self.transport, self.src, self.tag = transport, src, tag
        self.flat, self.copy_back = flat_target(arr)
        self.dtype, self.code = arr.dtype, dtype_code(arr.dtype)
        self.total, self.got, self.done = arr.nbytes, 0, False
        self.combine = None if op is None else combine_fn(op)

    def wait(self, timeout: float | None = None) -> None:
        self.transport.wait_handle(self, timeout)

    def describe(self) -> str:
        return f"recv from rank {self.src} ({describe_tag(self.tag)}, {self.got}/{self.total} bytes)"

    def peer(self) -> int:
        return self.src

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


class BytesRecv(Recv):
    """A receive of host bytes into the host uint8 array ``inbox`` that tolerates
    a message of another size: its pieces are consumed and dropped, and
    ``mismatch`` tells the caller (``LocalTransport.exchange``)."""

    __slots__ = ("mismatch",)

    def __init__(self, transport, src, tag, inbox):
        self.transport, self.src, self.tag = transport, src, tag
        self.flat, self.copy_back, self.combine = inbox, None, None
        self.dtype, self.code = inbox.dtype, dtype_code(inbox.dtype)
        self.total, self.got, self.done, self.mismatch = inbox.size, 0, False, False

    def check(self, total: int, code: int) -> None:
        if total != self.total:
            self.mismatch = True
            self.total = total  # drain the whole message

    def accept(self, piece: Any, offset: int) -> None:
        if not self.mismatch:
            self.flat[offset:offset + piece.size] = piece
        self.got += piece.size


class Unexpected:
    """A message that arrived before a matching receive was posted."""
    __slots__ = ("tag", "total", "code", "buf", "got", "claimed_by")

    def __init__(self, tag, total, code):
        self.tag, self.total, self.code, self.got = tag, total, code, 0
        self.buf = host_view(bytearray(total))
        self.claimed_by = None

    def accept(self, piece: Any, offset: int) -> None:
        self.buf[offset:offset + piece.size] = piece
        self.got += piece.size


class Channel:
    """Word indices and slot views of one direction of one pair.

    Each slot's payload is seen twice: ``payload[k]`` as a host uint8 array
    (to view as a dtype, reduce from, and copy large pieces) and ``raw[k]`` as
    a plain memoryview of the segment, through which small pieces are copied:
    a memoryview slice assignment is a memcpy with a third of the overhead of
    NumPy's indexing, which counts where the overhead is all there is
    (SMALL_COPY).
    """
    __slots__ = ("head_i", "tail_i", "hdr_i", "payload", "raw", "count")

    def __init__(self, buf, data, offset, nslots, slot_bytes):
        self.head_i = offset // 8
        self.tail_i = (offset + 64) // 8
        starts = [offset + shm.CHANNEL_HEADER_BYTES + k * (shm.SLOT_HEADER_BYTES + slot_bytes)
                  for k in range(nslots)]
        self.hdr_i = [s // 8 for s in starts]
        spans = [(s + shm.SLOT_HEADER_BYTES, s + shm.SLOT_HEADER_BYTES + slot_bytes)
                 for s in starts]
        self.payload = [data[lo:hi] for lo, hi in spans]
        self.raw = [buf[lo:hi] for lo, hi in spans]
        self.count = 0  # pieces written (outgoing) or consumed (incoming) by this rank

    def release(self) -> None:
        for view in self.raw:
            view.release()
