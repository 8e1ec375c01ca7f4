"""Point-to-point calls of the facade: send, recv, isend, irecv, recv_reduce; and
``post_send`` / ``post_recv``, isend / irecv for the library's own rings (async TP),
whose tags come from the group's collective sequence, outside the users' range.

``dst`` / ``src`` are global ranks (as in torch.distributed); ``tag`` tells
apart messages between the same pair. Sends and receives between a pair with
the same tag are matched in order. A receive that sees no progress for the
group's timeout raises ``CommTimeoutError`` naming the peer and the tag.

A blocking ``send`` of a message larger than the channel waits for the peer to
receive it (as MPI's ``Send`` may): two ranks that both ``send`` before they
``recv`` deadlock on large messages. Post one side with ``isend`` / ``irecv``.
"""
from __future__ import annotations

from typing import Any

from minidist.comm.group import USER_TAG_LIMIT, ProcessGroup, resolve
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.comm.transport.base import Handle
from minidist.trace import recorder as trace


def _check_tag(tag: int) -> int:
    if not 0 <= tag < USER_TAG_LIMIT:
        raise ValueError(f"tag must be in [0, {USER_TAG_LIMIT}), got {tag}")
    return tag


def isend(tensor: Any, dst: int, group: ProcessGroup | None = None, tag: int = 0) -> Handle:
    """Start sending ``tensor`` to rank ``dst``; do not modify it until ``wait()``."""
    return post_send(tensor, dst, resolve(group), _check_tag(tag))


def irecv(tensor: Any, src: int, group: ProcessGroup | None = None, tag: int = 0,
          op: ReduceOp | None = None) -> Handle:
    """Start receiving into ``tensor`` from rank ``src`` (reduce into it with ``op``)."""
    return post_recv(tensor, src, resolve(group), _check_tag(tag), op)


def post_send(tensor: Any, dst: int, g: ProcessGroup, tag: int) -> Handle:
    """``isend`` with any tag, for the library's own rings of point-to-point messages
    (async TP's collective matmul): ``tag`` from ``g.next_collective_tag()``, outside
    the users' range, so that no user message can be taken for one of the ring's."""
    start = trace.active.now() if trace.active is not None else 0.0
    handle = g.isend(tensor, g.group_rank(dst), tag)
    if trace.active is not None:
        trace.active.call("isend", g.ranks, start,
                          dict(peer=dst, tag=tag, bytes_sent=tensor.nbytes), g.group_desc)
        return _TracedHandle(handle, f"isend to {dst} tag={tag}", landing=False)
    return handle


def post_recv(tensor: Any, src: int, g: ProcessGroup, tag: int,
              op: ReduceOp | None = None) -> Handle:
    """``irecv`` with any tag: ``post_send``'s other end."""
    start = trace.active.now() if trace.active is not None else 0.0
    handle = g.irecv(tensor, g.group_rank(src), tag, op)
    if trace.active is not None:
        trace.active.call("irecv", g.ranks, start,
                          dict(peer=src, tag=tag, bytes_recv=tensor.nbytes), g.group_desc)
        return _TracedHandle(handle, f"irecv from {src} tag={tag}", landing=True)
    return handle


class _TracedHandle(Handle):
    """The handle of an ``isend`` / ``irecv`` while a trace is recorded: a ``wait()``
    that blocks is a "wait" span of cat "comm" (the communication no compute hid,
    trace/summary.py), and a receive's ``wait()`` ends the message's flow arrow at the
    moment it is complete (``landing``)."""

    def __init__(self, handle: Handle, what: str, landing: bool):
        self.handle, self.what, self.landing = handle, what, landing

    @property
    def done(self) -> bool:
        return self.handle.done

    def wait(self, timeout: float | None = None) -> None:
        start = trace.active.now() if trace.active is not None and not self.done else None
        self.handle.wait(timeout)
        if trace.active is None:
            return
        if start is not None:
            trace.active.span("wait", "comm", start, trace.active.now(), {"on": self.what})
        if self.landing:
            trace.active.landed()

    def is_completed(self) -> bool:
        return self.handle.is_completed()

    def describe(self) -> str:
        return self.handle.describe()


def _waited(g: ProcessGroup, handles: list, what: str, name: str = "", fields: dict | None = None,
            start: float = 0.0) -> None:
    """Wait for ``handles``, noting the call in the flight recorder (number -1:
    point-to-point calls have no number shared by the group) and, when tracing,
    as the span ``name`` from ``start`` with ``fields``."""
    g.transport.record_begin(g.ctx, -1, g.ranks, what)
    g.wait(handles, what)
    g.transport.record_end()
    if trace.active is not None:
        trace.active.call(name, g.ranks, start, fields, g.group_desc)


def send(tensor: Any, dst: int, group: ProcessGroup | None = None, tag: int = 0) -> None:
    g = resolve(group)
    start = trace.active.now() if trace.active is not None else 0.0
    h = g.isend(tensor, g.group_rank(dst), _check_tag(tag))
    if h.done and trace.active is None:
        return   # all of it went into free slots at once: nothing to wait for, nobody to name
    _waited(g, [h], f"send to rank {dst} tag={tag}", "send",
            dict(peer=dst, tag=tag, bytes_sent=tensor.nbytes), start)


def recv(tensor: Any, src: int, group: ProcessGroup | None = None, tag: int = 0) -> int:
    """Receive into ``tensor`` (same shape and dtype as sent). Returns ``src``."""
    g = resolve(group)
    if trace.active is None:   # the transport's blocking receive (a short way for one slot)
        g.group_rank(src)      # a member of the group, or ValueError
        what = f"recv from rank {src} tag={tag}"
        g.transport.record_begin(g.ctx, -1, g.ranks, what)
        g.transport.recv(tensor, src, _check_tag(tag), g.ctx, g.timeout, what)
        g.transport.record_end()
        g.stats.counted.bytes_recv += tensor.nbytes
        g.stats.counted.msgs_recv += 1
        return src
    start = trace.active.now()
    h = g.irecv(tensor, g.group_rank(src), _check_tag(tag))
    _waited(g, [h], f"recv from rank {src} tag={tag}", "recv",
            dict(peer=src, tag=tag, bytes_recv=tensor.nbytes), start)
    return src


def recv_reduce(tensor: Any, src: int, op: ReduceOp = ReduceOp.SUM,
                group: ProcessGroup | None = None, tag: int = 0) -> int:
    """Receive an array from ``src`` and fold it into ``tensor``: tensor = op(tensor, incoming).

    On the local transport the incoming bytes are reduced straight out of shared
    memory, without a temporary copy: the step ring algorithms are made of.
    """
    g = resolve(group)
    start = trace.active.now() if trace.active is not None else 0.0
    h = g.irecv(tensor, g.group_rank(src), _check_tag(tag), op)
    _waited(g, [h], f"recv_reduce from rank {src} tag={tag}", "recv_reduce",
            dict(peer=src, tag=tag, bytes_recv=tensor.nbytes, op=op.name), start)
    return src
