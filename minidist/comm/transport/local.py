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
ring all-reduce is made of: one read of the slot, no temporary). The pending
operations and how a piece lands in the receiver's array are in pending.py.

Nothing blocks: ``isend`` / ``irecv`` post an operation, and ``wait_all`` runs
the progress loop, which pushes pieces of every pending send while there are
free slots and pulls pieces of every pending receive. So a rank may post a
send to its right neighbour and a receive from its left one and wait for both,
whatever the message size, without deadlock. A message that arrives before its
receive is posted is kept in a side buffer (the "unexpected" queue), but only
when a receive with another tag is waiting behind it on the same channel.

``exchange`` (one step of the same-call check) and ``sendrecv`` (one step of
a ring) take a short way when nothing else is under way with their peers:
short_way.py. How a wait runs the progress loop, sleeps and ends early (an
aborted world, a finished peer, the timeout): local_wait.py. Beside the
channels, each rank has a slot on the board (board.py), written once and read
in place by every peer: the latency path of the small collectives.

Waiting (wait.py, the policy of every wait): when a pass moves nothing, the
rank polls again, then yields its core between polls, for up to ``spin_s``
seconds (the background thread of collectives/work.py does not poll at all).
Then it sleeps on its doorbell until a peer rings it (doorbell.py); peers ring
after every piece they publish and every slot they free. A wake-up costs from
a few to tens of microseconds (more in a VM), so sleeping is kept for long
waits: a peer that is computing, not communicating.

With an emulated link (link.py, off by default) each piece is stamped with
the time it lands; a receiver leaves it in its slot until then, and a rank
that waits only for pieces on the wire sleeps until the first one lands.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

from minidist.comm.transport import cma, flight, shm, topology
from minidist.comm.transport.board import Board, BoardWays, board_wanted
from minidist.comm.transport.doorbell import Doorbells
from minidist.comm.transport.shm import S_ARRIVAL, S_BYTES, S_CODE, S_OFFSET, S_TAG, S_TOTAL
from minidist.comm.transport.link import EmulatedLink
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.comm.transport.pending import SMALL_COPY, TAG_BITS, Channel, Recv, Send, Unexpected
from minidist.comm.transport.local_wait import InCall, LocalWaits
from minidist.comm.transport.short_way import ShortWays
from minidist.comm.transport.replace import Replacements
from minidist.comm.transport.base import Handle, Transport, dtype_code, host_bytes, host_view
from minidist.comm.transport.wait import REPLY_POLLS, SPIN_S, free_polls


class LocalTransport(LocalWaits, ShortWays, BoardWays, Replacements, Transport):
    """Point-to-point between the processes of one machine, through shared memory."""

    name = "shm"

    def __init__(self, segment_name: str, rank: int, timeout: float = 60.0):
        self.segment_name = segment_name
        self._seg = shm.attach(segment_name)
        self.world_size, self.nslots, self.slot_bytes, link_bps = shm.read_header(self._seg)
        if not 0 <= rank < self.world_size:
            shm.close(self._seg)
            raise ValueError(f"rank {rank} outside a world of {self.world_size}")
        self.rank, self.timeout = rank, timeout
        # Who holds each rank, and how many runs each finished (shm.py's rank records)
        self._ranks = shm.rank_records(self._seg)
        self._refuse_a_stranger(segment_name, rank)
        # How a wait spins, yields and sleeps on the doorbell: wait.py.
        self.spin_s = SPIN_S
        self.free_polls = free_polls(self.world_size)
        self.reply_polls = free_polls(self.world_size, REPLY_POLLS)   # exchange's reply
        self._words = self._seg.buf.cast("q")
        self._bells = Doorbells(self._seg.buf, shm.BELLS_OFFSET, self.world_size)
        # Our record of the flight recorder (flight.py): the call in progress.
        self._flight = flight.Recorder(self._seg.buf, shm.flight_offset(self.world_size), rank)
        self._all_ranks = list(range(self.world_size))   # a handle's record names the world
        data = host_view(self._seg.buf)
        n, k, s = self.world_size, self.nslots, self.slot_bytes
        buf = self._seg.buf
        self._out = [Channel(buf, data, shm.channel_offset(rank, d, n, k, s), k, s)
                     for d in range(n)]
        self._in = [Channel(buf, data, shm.channel_offset(src, rank, n, k, s), k, s)
                    for src in range(n)]
        self._sends: dict[int, deque] = {}       # dst -> sends in order
        self._posted: dict[int, list] = {}       # src -> receives not yet matched
        self._current: dict[int, Any] = {}       # src -> receive that is taking pieces now
        self._unexpected: dict[int, list] = {}   # src -> messages stashed early
        self._open_link_and_board(link_bps)
        self._lock = threading.RLock()
        self._in_call = InCall()   # .state: each thread's call in progress (local_wait.py)
        self._watched: dict[int, list] = {}   # ctx -> ranks whose death ends its calls
        self._posts = 0  # receives posted so far (see exchange)
        self._next_ctx = 1
        self._dropped: set = set()   # dead ranks whose state this rank dropped (replace.py)
        if self._ranks[rank * shm.RANK_WORDS + shm.R_DIED]:
            self._take_over()        # a replacement of a dead rank (replace.py)

    def _open_link_and_board(self, link_bps: int) -> None:
        """The emulated link (link.py: pieces take time on the wire, the CPU is free), the
        peer reads (cma.py) and the board (board.py), which skip the link's time."""
        n, rank = self.world_size, self.rank
        self.node_size, inter_bps = shm.read_topology(self._seg)  # 0: one level (link.py)
        self.topology = topology.declared(n, self.node_size)       # None: one level
        self._link = (EmulatedLink(link_bps, n, rank, self.node_size, inter_bps)
                      if link_bps or inter_bps else None)
        # Peers may read our arrays in one copy (cma.py). All-to-all does so only
        # without an emulated link; the direct all-reduce also over one (read_peer).
        self.peer_reads = cma.available()
        self.single_copy = self.peer_reads and self._link is None
        # The board: not over an emulated link, nor with MINIDIST_BOARD=0 (to compare
        # with the channels' way).
        capacity = shm.read_board_capacity(self._seg)
        self.board = (Board(self._seg.buf, shm.board_offset(n), n, rank, capacity)
                      if capacity and self._link is None and board_wanted() else None)

    # -- posting -------------------------------------------------------------
    def isend(self, arr: Any, dst: int, tag: int, ctx: int = 0) -> Handle:
        op = Send(self, dst, (ctx << TAG_BITS) | tag, host_bytes(arr), dtype_code(arr.dtype))
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
        return self._post_recv(Recv(self, src, (ctx << TAG_BITS) | tag, arr, op))

    def _post_recv(self, r):
        """Match ``r`` with a message stashed early, or queue it and pull what is there."""
        with self._lock:
            self._posts += 1  # tells a short-way exchange polling src to step aside
            src = r.src
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
    def _push(self, dst: int, op: Send) -> bool:
        """Write the next piece of ``op`` into a free slot; False if none is free."""
        n = min(self.slot_bytes, op.total - op.sent)
        if not self._write_piece(dst, op.tag, op.total, op.sent,
                                 op.data[op.sent:op.sent + n], op.code):
            return False
        op.sent += n
        if op.sent >= op.total:
            op.done = True
        return True

    def _write_piece(self, dst: int, tag: int, total: int, offset: int, piece: Any,
                     code: int) -> bool:
        """Copy one piece and its header into the next slot of the channel to
        ``dst``, then publish it; False if every slot is still full."""
        ch, w = self._out[dst], self._words
        if ch.count - w[ch.tail_i] >= self.nslots:
            return False
        k = ch.count % self.nslots
        n = piece.size
        # On an emulated link the piece goes on the wire as the copy starts (the
        # NIC reads memory while it sends): the copy is part of n / beta (link.py).
        arrival = self._link.stamp(dst, n) if self._link is not None else 0
        if n > SMALL_COPY:
            ch.payload[k][:n] = piece
        elif n:
            ch.raw[k][:n] = piece
        h = ch.hdr_i[k]
        w[h + S_TAG], w[h + S_TOTAL], w[h + S_OFFSET] = tag, total, offset
        w[h + S_BYTES], w[h + S_CODE], w[h + S_ARRIVAL] = n, code, arrival
        ch.count += 1
        w[ch.head_i] = ch.count  # publish: the piece is complete
        self._bells.ring(dst)
        return True

    def _pull(self, src: int) -> bool:
        """Consume the next piece from ``src`` if it has a destination."""
        ch, w = self._in[src], self._words
        if w[ch.head_i] == ch.count:
            return False
        h = ch.hdr_i[ch.count % self.nslots]
        if self._link is not None and not self._link.arrived(w[h + S_ARRIVAL]):
            return False  # still on the (emulated) wire
        target = self._current.get(src)
        if target is None:
            target = self._match(src, w[h + S_TAG], w[h + S_TOTAL], w[h + S_CODE])
            if target is None:
                return False  # nobody is receiving from src: leave it in the channel
            self._current[src] = target
        n = w[h + S_BYTES]
        target.accept(ch.payload[ch.count % self.nslots][:n], w[h + S_OFFSET])
        self._release(src, ch)
        if target.got >= target.total:
            del self._current[src]
            self._complete(src, target)
        return True

    def _release(self, src: int, ch: Channel) -> None:
        """The piece at the channel's tail has been taken: free its slot for
        ``src`` and ring its bell (it may be waiting to write)."""
        ch.count += 1
        self._words[ch.tail_i] = ch.count
        self._bells.ring(src)

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
        early = Unexpected(tag, total, code)
        self._unexpected.setdefault(src, []).append(early)
        return early

    def _complete(self, src: int, target) -> None:
        if isinstance(target, Recv):
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

    def link_bytes(self) -> Any:
        """Bytes put on the emulated links inside the node and between nodes (link.py),
        or None without an emulated link."""
        return self._link.link_bytes() if self._link is not None else None

    def read_arrival(self, src: int, nbytes: int) -> int:
        """When a read of ``nbytes`` from rank ``src``, asked for now, lands (ns;
        after what was asked of ``src`` before); 0 without an emulated link (link.py).
        Under the lock the sends take: the communication thread may read while the
        main thread sends, and both move the link's clocks and byte counts."""
        if self._link is None:
            return 0
        with self._lock:
            return self._link.stamp_read(src, nbytes)

    def read_peer(self, src: int, pid: int, address: int, out: Any, arrival: int = 0) -> bool:
        """One-copy read of rank ``src``'s memory (cma.py), once the bytes have
        landed at ``arrival`` (from ``read_arrival``; 0: at once)."""
        if arrival:
            self._link.sleep_until(arrival, self._check_abort)
        return cma.read(pid, address, out)

    # -- the flight recorder (flight.py) -------------------------------------
    def _flight_records(self) -> list:
        """Every rank's last call, read from the segment now."""
        return shm.flight_records(self._seg)

    def record_begin(self, ctx: int, number: int, ranks: list[int], text: str,
                     now: float | None = None) -> None:
        self._flight.begin(ctx, number, ranks, text, now)
        # whose death ends this call's waits (local_wait.py's _check_abort): a
        # collective's ranks, or those its context watches; a send or receive: its
        # peer only (_check_peers). Deaths in the world: checked at the first empty pass.
        state = self._in_call.state
        state.ctx, state.number, state.ranks, state.deaths = ctx, number, ranks, 0

    def record_end(self, now: float | None = None) -> None:
        self._flight.end(now)
        state = self._in_call.state
        state.ranks, state.number = None, -1

    # -- groups and shutdown -------------------------------------------------
    def new_context(self, ranks: list[int]) -> int:
        ctx = self._next_ctx
        self._next_ctx += 1
        return ctx

    def watch_deaths(self, ctx: int, ranks: list[int]) -> None:
        self._watched[ctx] = list(ranks)

    def forget(self, ctx: int) -> None:
        with self._lock:
            for dst, queue in list(self._sends.items()):
                kept = deque(op for op in queue if op.sent or op.tag >> TAG_BITS != ctx)
                if kept:
                    self._sends[dst] = kept
                else:
                    del self._sends[dst]
            for src, posted in list(self._posted.items()):
                posted[:] = [r for r in posted if r.tag >> TAG_BITS != ctx]
                if not posted:
                    del self._posted[src]

    def abort(self, message: str) -> None:
        if self._seg is not None:
            shm.set_abort(self._seg, self.rank, message)

    def close(self) -> None:
        if self._seg is None:
            return
        for ch in self._out + self._in:
            ch.release()
        self._out = self._in = []
        if self.board is not None:
            self.board.release()
        self._words.release()
        self._ranks.release()
        self._bells.close()
        self._flight.close()
        seg, self._seg = self._seg, None
        shm.close(seg)
