"""The shared-memory segment of a local world, and its layout.

One segment per world, created by the parent that starts the world and
unlinked by it when the world ends (children unlink it too if the parent
vanished). Its name starts with ``minidist_`` so that a leftover in /dev/shm is
easy to spot (``leftover_segments()``).

Layout (all offsets multiples of 64 bytes, one cache line)::

    world header (1024 B): magic, world_size, nslots, slot_bytes, abort word,
                           the emulated link's bytes/s, node size and bytes/s
                           between nodes (link.py), abort message
    doorbells (64 B per rank, doorbell.py)
    flight records (384 B per rank, flight.py)
    rank records (64 B per rank): the pid of the process that holds the rank
                           (written by the launcher's rank process; another process
                           cannot join as that rank) and how many runs it finished
                           (a peer waiting on a rank that finished the run fails at
                           once, naming it)
    the board: one slot per rank that every peer reads (board.py), padded to a
               multiple of 4096 B
    channel[src * N + dst] for every ordered pair, each:
        head   (64 B)  pieces written by src       (only src writes it)
        tail   (64 B)  pieces consumed by dst      (only dst writes it)
        nslots x (slot header 64 B + payload slot_bytes)

A channel is a single-producer single-consumer ring: src may write piece
``head`` into slot ``head % nslots`` while ``head - tail < nslots``; dst may read
slot ``tail % nslots`` while ``tail < head``. Each counter has one writer, so no
lock is needed. On x86 stores become visible in program order, so the payload
and slot header written before ``head`` is bumped are complete when the reader
sees the new ``head``.
"""
from __future__ import annotations

import itertools
import os
import secrets

from multiprocess import resource_tracker, shared_memory

from minidist.comm.transport import board, flight
from minidist.comm.transport.doorbell import BYTES_PER_RANK, Doorbells

PREFIX = "minidist_"
HEADER_BYTES = 1024
BELLS_OFFSET = HEADER_BYTES
SLOT_HEADER_BYTES = 64
CHANNEL_HEADER_BYTES = 128
MAGIC = 0x6D696E6964697374  # "minidist"

# Word indices (int64) in the world header.
W_MAGIC, W_WORLD, W_NSLOTS, W_SLOT_BYTES, W_ABORT, W_ABORT_LEN, W_LINK = range(7)
W_NODE_SIZE, W_INTER_LINK = 7, 8   # two-level topology (link.py); 0: one node
W_DEATHS = 10                      # ranks marked dead so far (mark_died), for acknowledge
W_BOARD = 9                        # data bytes of a rank's slot on the board (board.py)
# Word indices (int64) in a slot's header, from the slot's first word h: what the
# sender writes beside each piece (local.py, short_way.py).
S_TAG, S_TOTAL, S_OFFSET, S_BYTES, S_CODE, S_ARRIVAL = range(6)
# the message's tag, its total bytes, this piece's offset in it and its bytes,
# the dtype code checked on receipt, when it lands on an emulated link (link.py)
ABORT_MSG_OFFSET = 128
# Word indices (int64) in a rank's record: the pid holding the rank (0: none recorded),
# the runs it finished (World.run calls that returned on it), whether it died (DIED_BASE + its
# exit code, -9 for SIGKILL; 0: alive) in a world that keeps going without it (World(fault_tolerant))
RANK_BYTES, R_PID, R_RUNS, R_DIED = 64, 0, 1, 2
# ... how many times a replacement process took the rank over (revive), and how many of
# the world's deaths (W_DEATHS) the rank has dropped its state for (LocalTransport)
R_INCARNATION, R_SEEN = 3, 4
RANK_WORDS = RANK_BYTES // 8
DIED_BASE = 257   # so that any exit code, -256 .. 255, is stored as a positive word
ABORT_MSG_MAX = HEADER_BYTES - ABORT_MSG_OFFSET

_counter = itertools.count()


def channel_bytes(nslots: int, slot_bytes: int) -> int:
    return CHANNEL_HEADER_BYTES + nslots * (SLOT_HEADER_BYTES + slot_bytes)


def flight_offset(world_size: int) -> int:
    """Where the flight records start: after the doorbells."""
    return BELLS_OFFSET + world_size * BYTES_PER_RANK


def ranks_offset(world_size: int) -> int:
    """Where the rank records start: after the flight records."""
    return flight_offset(world_size) + flight.region_bytes(world_size)


def board_offset(world_size: int) -> int:
    """Where the board starts: after the rank records, on a cache line."""
    end = ranks_offset(world_size) + world_size * RANK_BYTES
    return -(-end // 64) * 64


def board_capacity(slot_bytes: int) -> int:
    """Data bytes of a rank's slot on the board: BOARD_BYTES, at most a channel slot."""
    return min(board.BOARD_BYTES, slot_bytes)


def channels_offset(world_size: int, slot_bytes: int) -> int:
    """Where the channels start: after the header, doorbells, flight and rank records
    and the board, page aligned."""
    end = (board_offset(world_size)
           + world_size * board.slot_bytes(world_size, board_capacity(slot_bytes)))
    return -(-end // 4096) * 4096


def channel_offset(src: int, dst: int, world_size: int, nslots: int, slot_bytes: int) -> int:
    return (channels_offset(world_size, slot_bytes)
            + (src * world_size + dst) * channel_bytes(nslots, slot_bytes))


def segment_bytes(world_size: int, nslots: int, slot_bytes: int) -> int:
    return (channels_offset(world_size, slot_bytes)
            + world_size * world_size * channel_bytes(nslots, slot_bytes))


def create(world_size: int, nslots: int, slot_bytes: int, link_bytes_per_s: int = 0,
           node_size: int = 0, inter_bytes_per_s: int = 0) -> shared_memory.SharedMemory:
    """Create a zeroed segment for a world and write its header
    (``link_bytes_per_s``: the emulated link of link.py, 0 for none;
    ``node_size`` ranks per node and ``inter_bytes_per_s`` between nodes, 0 for none)."""
    if slot_bytes % 64 or slot_bytes <= 0:
        raise ValueError(f"slot_bytes must be a positive multiple of 64, got {slot_bytes}")
    if nslots < 1:
        raise ValueError(f"nslots must be at least 1, got {nslots}")
    name = f"{PREFIX}{os.getpid()}_{next(_counter)}_{secrets.token_hex(4)}"
    seg = shared_memory.SharedMemory(name=name, create=True,
                                     size=segment_bytes(world_size, nslots, slot_bytes))
    words = seg.buf[:HEADER_BYTES].cast("q")
    words[W_WORLD] = world_size
    words[W_NSLOTS] = nslots
    words[W_SLOT_BYTES] = slot_bytes
    words[W_LINK] = link_bytes_per_s
    words[W_NODE_SIZE] = node_size
    words[W_INTER_LINK] = inter_bytes_per_s
    words[W_BOARD] = board_capacity(slot_bytes)
    words[W_MAGIC] = MAGIC
    words.release()
    return seg


def untrack(seg: shared_memory.SharedMemory) -> None:
    """Leave the segment to the launcher: opening it registered it with this process's
    resource tracker, which would unlink it when this process exits. Only for a process
    that is not one of the world's ranks (those share the launcher's tracker, where
    the registration is the launcher's own)."""
    resource_tracker.unregister(seg._name, "shared_memory")


def attach(name: str) -> shared_memory.SharedMemory:
    """Open an existing world segment by name (from a child process)."""
    seg = shared_memory.SharedMemory(name=name, create=False)
    words = seg.buf[:HEADER_BYTES].cast("q")
    ok = words[W_MAGIC] == MAGIC
    words.release()
    if not ok:
        seg.close()
        raise ValueError(f"shared-memory segment {name!r} is not a minidist world")
    return seg


def read_header(seg: shared_memory.SharedMemory) -> tuple[int, int, int, int]:
    """(world_size, nslots, slot_bytes, link bytes per second) of a segment."""
    words = seg.buf[:HEADER_BYTES].cast("q")
    out = (words[W_WORLD], words[W_NSLOTS], words[W_SLOT_BYTES], words[W_LINK])
    words.release()
    return out


def read_board_capacity(seg: shared_memory.SharedMemory) -> int:
    """Data bytes of a rank's slot on the board (board.py)."""
    words = seg.buf[:HEADER_BYTES].cast("q")
    out = words[W_BOARD]
    words.release()
    return out


def read_topology(seg: shared_memory.SharedMemory) -> tuple[int, int]:
    """(ranks per node, bytes per second between nodes) of a segment; 0 for none."""
    words = seg.buf[:HEADER_BYTES].cast("q")
    out = (words[W_NODE_SIZE], words[W_INTER_LINK])
    words.release()
    return out


def set_abort(seg: shared_memory.SharedMemory, rank: int, message: str) -> None:
    """Tell every rank of the world to stop: rank ``rank`` failed (or -1: the parent).
    Sleeping ranks are woken so that they see it at once."""
    words = seg.buf[:HEADER_BYTES].cast("q")
    if words[W_ABORT] == 0:
        data = message.encode("utf-8", "replace")[:ABORT_MSG_MAX]
        seg.buf[ABORT_MSG_OFFSET:ABORT_MSG_OFFSET + len(data)] = data
        words[W_ABORT_LEN] = len(data)
        words[W_ABORT] = rank + 2  # 0 means "no abort"; -1 (the parent) becomes 1
    world_size = words[W_WORLD]
    words.release()
    bells = Doorbells(seg.buf, BELLS_OFFSET, world_size)
    bells.ring_all()
    bells.close()


def abort_reason(seg: shared_memory.SharedMemory) -> tuple[int, str] | None:
    """(failed rank, message) if the world was aborted, else None."""
    words = seg.buf[:HEADER_BYTES].cast("q")
    flag, length = words[W_ABORT], words[W_ABORT_LEN]
    words.release()
    if flag == 0:
        return None
    msg = bytes(seg.buf[ABORT_MSG_OFFSET:ABORT_MSG_OFFSET + length]).decode("utf-8", "replace")
    return flag - 2, msg


def rank_records(seg: shared_memory.SharedMemory) -> memoryview:
    """The rank records as int64 words (rank r's at ``r * RANK_WORDS``); release it."""
    world_size = read_header(seg)[0]
    start = ranks_offset(world_size)
    return seg.buf[start:start + world_size * RANK_BYTES].cast("q")


def hold_rank(seg: shared_memory.SharedMemory, rank: int, pid: int) -> None:
    """Record that process ``pid`` is rank ``rank`` (the launcher's rank process, first
    thing): only it may join the world as that rank (LocalTransport)."""
    words = rank_records(seg)
    words[rank * RANK_WORDS + R_PID] = pid
    words.release()


def finish_run(seg: shared_memory.SharedMemory, rank: int) -> None:
    """Rank ``rank`` returned from a run: count it, and wake every rank, so that one
    waiting for a message from it sees at once that none will come."""
    words = rank_records(seg)
    words[rank * RANK_WORDS + R_RUNS] += 1
    words.release()
    _wake_all(seg)


def mark_died(seg: shared_memory.SharedMemory, rank: int, exit_code: int) -> None:
    """The launcher saw rank ``rank`` die (exit code ``exit_code``, -9 for SIGKILL) and
    lets the world go on: note it, and wake every rank, so that one waiting in a
    collective of it fails at once (local_wait.py, ``PeerDiedError``)."""
    words = rank_records(seg)
    words[rank * RANK_WORDS + R_DIED] = DIED_BASE + exit_code
    words.release()
    header = seg.buf[:HEADER_BYTES].cast("q")
    header[W_DEATHS] += 1          # after the mark: a rank that reads the count sees it
    header.release()
    _wake_all(seg)


def deaths(seg: shared_memory.SharedMemory) -> int:
    """How many ranks the launcher has marked dead so far."""
    header = seg.buf[:HEADER_BYTES].cast("q")
    count = header[W_DEATHS]
    header.release()
    return count


def seen_deaths(seg: shared_memory.SharedMemory, rank: int) -> int:
    """How many of the world's deaths rank ``rank`` has dropped its state for."""
    words = rank_records(seg)
    count = words[rank * RANK_WORDS + R_SEEN]
    words.release()
    return count


def revive(seg: shared_memory.SharedMemory, rank: int) -> None:
    """A replacement process is about to take dead rank ``rank`` over: count the
    incarnation and free the pid. The rank stays marked dead until the replacement's
    transport has set its channels right (LocalTransport) and clears the mark."""
    words = rank_records(seg)
    words[rank * RANK_WORDS + R_INCARNATION] += 1
    words[rank * RANK_WORDS + R_PID] = 0
    words.release()


def _wake_all(seg: shared_memory.SharedMemory) -> None:
    """Ring every rank's doorbell (a rank asleep in a wait looks again)."""
    bells = Doorbells(seg.buf, BELLS_OFFSET, read_header(seg)[0])
    bells.ring_all()
    bells.close()


def flight_records(seg: shared_memory.SharedMemory) -> list:
    """Every rank's last communication call (flight.py), read from the segment."""
    world_size = read_header(seg)[0]
    return flight.read(seg.buf, flight_offset(world_size), world_size)


def close(seg: shared_memory.SharedMemory) -> None:
    """Unmap a segment; tolerate views that are still alive (the OS unmaps at exit)."""
    try:
        seg.close()
    except BufferError:
        # Arrays still view it (the plans of the board's latency path, kept by
        # their group): they keep the mapping alive until they go; drop our
        # handle, so that it is not closed again, noisily, at exit.
        seg._mmap = None


def unlink(name: str) -> None:
    """Remove a segment's name from /dev/shm; no error if it is already gone."""
    try:
        seg = shared_memory.SharedMemory(name=name, create=False)
    except FileNotFoundError:
        return
    try:
        seg.unlink()
    except FileNotFoundError:
        pass
    close(seg)


def leftover_segments() -> list[str]:
    """Names of minidist segments present in /dev/shm (should be empty between worlds)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(PREFIX))
    except FileNotFoundError:
        return []
