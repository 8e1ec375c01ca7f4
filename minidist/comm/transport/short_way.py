"""The local transport's short ways: the two calls the collectives make most.

A collective is a handful of calls of two shapes: ``exchange``, the one-slot
swap of the same-call check and of the small all-reduce, and ``sendrecv``, one
step of a ring or of recursive doubling. Through the general way (isend,
irecv, wait_all in local.py) each pays for a Send and a Recv object, the
queues, the matching of tags and a progress loop over every channel: about
10 us of Python per step, which is the whole cost of a small collective and,
with more ranks than cores, a large part of a big one.

So when nothing else is under way with the two peers, these calls take a
short way: write our pieces straight into the free slots of the outgoing
channel and take the peer's pieces straight out of the incoming one, in one
loop, checking only that the first incoming piece carries our tag. The bytes
and the headers in shared memory are exactly those of the general way, so the
peer may take either way. Anything unusual (another message first, a wait
longer than ``spin_s``, the background thread of collectives/work.py, an emulated link)
hands what is left to the general way, which handles every case (a death marked in
the world too: the general way checks it at once, local_wait.py).
"""
from __future__ import annotations

from collections import deque
from typing import Any

from minidist.comm.transport.reduce_op import ReduceOp
from minidist.comm.transport.shm import S_BYTES, S_CODE, S_OFFSET, S_TAG, S_TOTAL
from minidist.comm.transport.pending import SMALL_COPY, TAG_BITS, BytesRecv, Recv, Send
from minidist.comm.transport.base import dtype_code, host_bytes, host_view
from minidist.comm.transport.wait import Backoff, in_background_thread

_BYTES_CODE = dtype_code(host_view(bytearray(1)).dtype)  # the header's dtype of raw bytes


class ShortWays:
    """Mixed into LocalTransport (local.py), whose channels and lock it uses."""

    # -- the small exchanges of the call check -------------------------------
    def exchange(self, data: Any, dst: int, inbox: Any, src: int, tag: int, ctx: int = 0,
                 timeout: float | None = None, what: str = "", abortable: bool = True) -> bool:
        """Send the host bytes ``data`` to ``dst`` and receive one message from
        ``src`` into the host bytes ``inbox``; False if that message had another
        size (it is then drained and dropped). See ``Transport.exchange``.

        The short way, taken when the message fits in one slot and no other
        send or receive of this process is under way with these peers: write
        header and payload into the slot at once (no Send object, no queue),
        then poll the incoming channel's head word until the reply is there and
        copy it out. The bytes and headers in shared memory are exactly those
        of isend / irecv; only the Python bookkeeping (Send and Recv objects,
        queues, matching) is left out, which is most of the time a small
        exchange takes. Anything unusual (a full channel, a bigger message,
        another tag first, another thread posting a receive meanwhile, no
        reply within spin_s, an emulated link) falls back to isend / irecv /
        wait_all, which handle every case.
        """
        wire = (ctx << TAG_BITS) | tag
        with self._lock:
            sent = (self._link is None and dst not in self._sends
                    and data.size <= self.slot_bytes
                    and self._write_piece(dst, wire, data.size, 0, data, _BYTES_CODE))
            quiet = not (self._posted.get(src) or src in self._current
                         or self._unexpected.get(src))
            posts = self._posts
        if sent and quiet and not in_background_thread():
            same = self._poll_reply(src, wire, inbox, posts)
            if same is not None:
                return same
        # The general way.
        pending = [] if sent else [self.isend(data, dst, tag, ctx)]
        r = self._post_recv(BytesRecv(self, src, wire, inbox))
        self.wait_all(pending + [r], timeout, what, abortable)
        return not r.mismatch

    def _poll_reply(self, src: int, wire: int, inbox: Any, posts: int) -> bool | None:
        """Wait (spinning, yielding) for a one-piece message with tag ``wire`` from
        ``src`` and take it: True if it had ``inbox.size`` bytes, False if not
        (dropped); None to hand over to the general way, having taken nothing."""
        ch = self._in[src]
        seen = self._next_piece(ch, posts)
        if seen is None:
            return None
        with self._lock:
            k = self._whole_message(ch, seen, posts, wire)
            if k is None:
                return None
            total = self._words[ch.hdr_i[k] + S_TOTAL]
            same = total == inbox.size
            if same and total > SMALL_COPY:
                inbox[:] = ch.payload[k][:total]
            elif same:
                memoryview(inbox)[:] = ch.raw[k][:total]
            self._release(src, ch)
        return same

    def _next_piece(self, ch, posts: int) -> int | None:
        """Poll (spinning, then yielding) until a piece is in the incoming channel
        ``ch``; its number, or None when another thread posted a receive (it
        may take our message) or the wait grew long (wait_all sleeps on the
        doorbell)."""
        w, seen = self._words, ch.count
        backoff = Backoff(self.spin_s, self.reply_polls)
        while w[ch.head_i] == seen:
            if self._posts != posts or backoff.idle() or self._death_unseen():
                return None
        return seen

    def _whole_message(self, ch, seen: int, posts: int, wire: int) -> int | None:
        """The slot of piece ``seen`` if it is a whole message with tag ``wire``
        and nobody took it meanwhile; None (another tag first, a message in
        several pieces) for the general way. The caller holds the lock."""
        if self._posts != posts or ch.count != seen:
            return None
        k = seen % self.nslots
        h = ch.hdr_i[k]
        w = self._words
        if w[h + S_TAG] != wire or w[h + S_BYTES] != w[h + S_TOTAL]:
            return None
        return k

    # -- a blocking receive of one piece -----------------------------------------
    def recv(self, arr: Any, src: int, tag: int, ctx: int = 0, timeout: float | None = None,
             what: str = "") -> None:
        """Receive into ``arr`` from ``src``, blocking. See ``Transport.recv``.

        The short way, taken when the message fits one slot and nothing else
        is under way with ``src``: poll the channel's head word until a piece
        is there and, if it is a whole message with our tag, take it (its size
        and dtype checked as always). Anything else (another tag or a message
        in pieces first, a long wait, another thread posting) leaves the
        channel as it was to the general way (irecv, wait_all)."""
        wire = (ctx << TAG_BITS) | tag
        r = Recv(self, src, wire, arr, None)
        with self._lock:
            quiet = (self._link is None and r.total <= self.slot_bytes
                     and not (self._posted.get(src) or src in self._current
                              or self._unexpected.get(src)))
            posts = self._posts
        if quiet and not in_background_thread() and self._take_whole(src, wire, r, posts):
            return
        self.wait_all([self._post_recv(r)], timeout, what)

    def _take_whole(self, src: int, wire: int, r: Recv, posts: int) -> bool:
        """Wait (spinning, yielding) for the next piece from ``src``; if it is a
        whole message with tag ``wire``, deliver it into ``r`` and return True.
        False, having taken nothing, for the general way."""
        ch, w = self._in[src], self._words
        seen = self._next_piece(ch, posts)
        if seen is None:
            return False
        with self._lock:
            k = self._whole_message(ch, seen, posts, wire)
            if k is None:
                return False
            h = ch.hdr_i[k]
            total = w[h + S_TOTAL]
            r.check(total, w[h + S_CODE])  # raises, leaving it in the channel, as _match does
            r.accept(ch.payload[k][:total], 0)
            self._release(src, ch)
            r.complete()
        return True

    # -- one step of a ring ----------------------------------------------------
    def sendrecv(self, send_arr: Any, dst: int, recv_arr: Any, src: int, tag: int,
                 ctx: int = 0, op: ReduceOp | None = None, timeout: float | None = None,
                 what: str = "", abortable: bool = True) -> None:
        """One step of a ring: send to ``dst`` while receiving (or reducing) from
        ``src``. See ``Transport.sendrecv``.

        The short way, taken when nothing else is under way with these peers:
        one loop writes pieces of the outgoing message into free slots and
        takes pieces of the incoming one as they come, with no Send object, no
        queues and no matching (the same bytes and headers in shared memory as
        isend / irecv). A ring step is only this, so its cost is the copies
        plus a few microseconds. Anything unusual (another message first, a
        wait longer than spin_s, the background thread, an emulated link)
        hands what is left to the general way.
        """
        wire = (ctx << TAG_BITS) | tag
        data, code = host_bytes(send_arr), dtype_code(send_arr.dtype)
        r = Recv(self, src, wire, recv_arr, op)
        sent, send_done = 0, False
        with self._lock:
            if (self._link is None and dst not in self._sends and not in_background_thread()
                    and not (self._posted.get(src) or src in self._current
                             or self._unexpected.get(src))):
                sent, send_done = self._short_sendrecv(data, dst, code, r, src, wire)
            if send_done and r.done:
                return
            # The general way, for what is left of either message.
            pending = [r]
            if not send_done:
                s = Send(self, dst, wire, data, code)
                s.sent = sent
                self._sends.setdefault(dst, deque()).append(s)
                pending.append(s)
            if r.done:
                pass                    # complete: the next pieces from src are not ours
            elif r.got:
                self._current[src] = r  # its first pieces are in: the rest follow in order
            else:
                self._post_recv(r)
        self.wait_all(pending, timeout, what, abortable)

    def _short_sendrecv(self, data: Any, dst: int, code: int, r: Recv, src: int,
                        wire: int) -> tuple[int, bool]:
        """Move pieces both ways until both messages are through or the short
        way gives up; return (bytes sent, whole message sent). The caller
        holds the lock throughout, so no other thread writes to ``dst`` or
        reads from ``src`` meanwhile."""
        ch, w = self._in[src], self._words
        total, sent, send_done = data.size, 0, False
        backoff = Backoff(self.spin_s, self.free_polls)
        while True:
            moved = False
            while not send_done:
                n = min(self.slot_bytes, total - sent)
                if not self._write_piece(dst, wire, total, sent, data[sent:sent + n], code):
                    break
                sent += n
                send_done = sent >= total
                moved = True
            while not r.done and w[ch.head_i] != ch.count:
                k = ch.count % self.nslots
                h = ch.hdr_i[k]
                if r.got == 0:
                    if w[h + S_TAG] != wire:
                        return sent, send_done  # another message first: the general way
                    r.check(w[h + S_TOTAL], w[h + S_CODE])
                r.accept(ch.payload[k][:w[h + S_BYTES]], w[h + S_OFFSET])
                self._release(src, ch)
                if r.got >= r.total:
                    r.complete()
                moved = True
            if send_done and r.done:
                return sent, send_done
            if moved:
                backoff.reset()
            elif backoff.idle() or self._death_unseen():
                return sent, send_done  # a long wait (wait_all sleeps) or a death to check
