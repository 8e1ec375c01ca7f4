"""Healing: a replica that is behind receives the whole training state from a live peer.

The state (whatever the user's ``state_dict()`` returns, pack.py) travels over the
quorum's group from the source (a member at the quorum's step) to each healing member
in two messages:

    1. the sizes: (len(skeleton), len(buffer)), two int64, so the receiver can
       allocate the buffer;
    2. the buffer: the skeleton and every array in one contiguous run of bytes
       (``pack_state``), copied as it is, so the healed replica is bit-identical to
       its source.

    bytes moved = 16 + len(buffer) = 16 + up(len(skeleton)) + sum_i up(nbytes(array_i))

One message for the state, not one per array: per message the transport pays a fixed
cost (a handshake, a wake-up of the receiver), which for an MLP's ~30 arrays was most
of the transfer. No checkpoint is read or written: the transfer is the same send/recv
every collective is built from (comm/collectives/p2p.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives.p2p import recv, send
from minidist.comm.group import ProcessGroup
from minidist.parallel.fault_tolerance.pack import pack_state, unpack_state

SIZES_BYTES = 16       # message 1: two int64


class Received(NamedTuple):
    """What ``recv_state`` took in."""
    state: Any            # the state, as the source's ``state_dict()`` returned it
    nbytes: int           # the bytes moved: 16 + len(buffer)


def send_state(state: Any, dsts: Sequence[int], group: ProcessGroup) -> int:
    """Send ``state`` to each global rank in ``dsts`` of ``group`` (packed once);
    return the bytes sent, all of them together."""
    buffer, skeleton_bytes = pack_state(state)
    sizes = backend.from_host([skeleton_bytes, int(buffer.size)], dtype="int64")
    for dst in dsts:
        send(sizes, dst, group)
        send(buffer, dst, group)
    return len(dsts) * (SIZES_BYTES + int(buffer.size))


def recv_state(src: int, group: ProcessGroup) -> Received:
    """Receive a state that ``send_state`` sends from global rank ``src`` of ``group``."""
    sizes = xp.zeros(2, dtype="int64")
    recv(sizes, src, group)
    skeleton_bytes, length = (int(v) for v in backend.to_host(sizes))
    buffer = xp.empty(length, dtype="uint8")                                   # (len,)
    recv(buffer, src, group)
    # the arrays as views of ``buffer``, which only this call holds: load_state_dict
    # copies them into the parameters and the optimizer's state
    return Received(unpack_state(buffer, skeleton_bytes, copy=False), SIZES_BYTES + length)
