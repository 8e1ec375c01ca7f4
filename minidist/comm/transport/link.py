"""An emulated link: bytes that take time on the wire, while the CPU is free.

On this transport a message is moved by the CPU: the sender copies it into
shared memory and the receiver copies (or adds) it out. Those copies are the
whole cost, and they run on the same cores as the computation, so overlapping
communication with computation cannot hide them: both want the core.

A real interconnect is different. NVLink, InfiniBand or Ethernet move the bytes
with a DMA engine while the cores (or the GPU's SMs) compute; a message of M
bytes is on the wire for

    t_wire = M / beta

during which the sender and the receiver are free. That is what DDP's overlap
of gradient all-reduce with backward exploits.

``EmulatedLink`` gives each ordered pair of ranks such a link of ``beta`` bytes
per second. Each piece written into a channel is stamped with the time it
arrives: the link is busy with earlier pieces until ``free_at``, then carries
this one for ``n / beta`` seconds:

    arrival = max(now, free_at[dst]) + n / beta;   free_at[dst] = arrival

``now`` is when the sender starts copying the piece into its slot: a NIC reads
the sender's memory while the bytes go out, so that copy is part of the
n / beta on the wire, not added to it (it is added only if it takes longer).

The receiver does not take a piece before its arrival time, and a rank that
waits only for pieces still on the wire sleeps until the first of them lands
(no CPU used). A rank that sleeps on its doorbell (a peer rings it when it
publishes a piece, local_wait.py) wakes by then too (``seconds_to_next``): the
ring came as the piece was published, before it landed, and no other ring may
follow. The links are full duplex and independent: rank r sending to
r+1 does not slow r+1 sending to r.

A collective that reads its peers' memory (collectives/direct.py) sends no
piece: the reader stamps what it is about to read itself, on its incoming link
from the peer (``stamp_read``), and sleeps until it would have arrived before
it copies it (``sleep_until``), so n bytes read cost the same n / beta as n
bytes sent.

Turn it on with ``World(n, link_gbps=2.0)`` or ``MINIDIST_LINK_GBPS=2`` (in
GB/s, 1e9 bytes per second); the default is off.

Two levels: real clusters have fast links inside a node (NVLink, ~50 GB/s)
and slower ones between nodes (InfiniBand, ~12.5 GB/s). With
``World(4, node_size=2, link_gbps=20, inter_node_gbps=2)`` (or
``MINIDIST_NODE_SIZE`` and ``MINIDIST_INTER_NODE_GBPS``) ranks r and d are on
the same node when r // node_size == d // node_size; pieces between nodes
travel at ``inter_node_gbps``, the others at ``link_gbps`` (0: no delay, as
shared memory). The hierarchical all-reduce (comm/collectives/hierarchical.py)
is built for this topology. It is part of the segment's
header, so every rank of a world sees the same link. The times are
``time.monotonic_ns()``, one clock for every process of the machine.

Bytes per link: every piece sent and every read is stamped here, so the link counts
the bytes this rank put on the wire with each peer (``carried``: sent to it, or read
from it); ``link_bytes()`` sums them inside this rank's node and between nodes. Summed
over the ranks, ``between`` is every byte that crossed the slow links once (what
``dist.get_link_bytes()`` returns and bench/bench_diloco.py reads).
"""
from __future__ import annotations

import os
import time

from typing import NamedTuple

from minidist.comm.transport.topology import NODE_SIZE_ENV

ENV = "MINIDIST_LINK_GBPS"
INTER_ENV = "MINIDIST_INTER_NODE_GBPS"
MAX_NAP_S = 0.05  # a waiting rank still looks at the abort flag this often


def link_bytes_per_s(link_gbps: float | None, env: str = ENV) -> int:
    """The link rate in bytes per second (0: no emulated link), from the
    argument or, if that is None, from the variable ``env`` (MINIDIST_LINK_GBPS)."""
    if link_gbps is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return 0
        try:
            link_gbps = float(text)
        except ValueError:
            raise ValueError(f"{env}={text!r} is not a number of GB/s") from None
    if not link_gbps >= 0 or link_gbps == float("inf"):
        raise ValueError(f"{env.lower().replace('minidist_', '')} must be a finite number "
                         f">= 0 (0: off), got {link_gbps}")
    return int(link_gbps * 1e9)


def topology(world_size: int, node_size: int | None,
             inter_node_gbps: float | None) -> tuple[int, int]:
    """(ranks per node, bytes/s between nodes), from the arguments or the
    environment (MINIDIST_NODE_SIZE, MINIDIST_INTER_NODE_GBPS); (0, 0): one level."""
    if node_size is None:
        text = os.environ.get(NODE_SIZE_ENV, "").strip()
        if not text.isdigit() and text:
            raise ValueError(f"{NODE_SIZE_ENV}={text!r} is not a whole number of ranks")
        node_size = int(text) if text else 0
    inter = link_bytes_per_s(inter_node_gbps, INTER_ENV)
    if node_size == 0 and not inter:
        return 0, 0
    if node_size < 1 or world_size % node_size:
        raise ValueError(f"node_size must divide the world size {world_size} (ranks per "
                         f"node), got {node_size}")
    return node_size, inter


class LinkBytes(NamedTuple):
    """Bytes this rank put on its emulated links (sent, or read from a peer)."""
    inside: int        # with the ranks of its own node (the fast links)
    between: int       # with ranks of other nodes (the slow links)


class EmulatedLink:
    """The outgoing links of one rank, and the earliest piece it waits for."""

    def __init__(self, bytes_per_s: int, world_size: int, rank: int = 0, node_size: int = 0,
                 inter_bytes_per_s: int = 0):
        def ns(rate: int) -> float:
            return 1e9 / rate if rate else 0.0   # 0: no emulated delay on that level
        node = (lambda r: r // node_size) if node_size else (lambda r: 0)
        self.ns_per_byte = [ns(bytes_per_s) if node(dst) == node(rank) or not inter_bytes_per_s
                            else ns(inter_bytes_per_s) for dst in range(world_size)]
        self.free_at = [0] * world_size  # dst -> when its link has carried everything sent
        self.read_free_at = [0] * world_size  # src -> ... everything read from src
        self.next_arrival = 0            # earliest arrival seen on the wire (0: none)
        self.carried = [0] * world_size  # peer -> bytes put on the link with it (sent, read)
        self.remote = [bool(node_size) and node(dst) != node(rank) for dst in range(world_size)]

    def stamp(self, dst: int, nbytes: int) -> int:
        """The arrival time (ns) of ``nbytes`` sent now to ``dst``."""
        return self._carry(self.free_at, dst, nbytes)

    def _carry(self, free_at: list, peer: int, nbytes: int) -> int:
        """The link to or from ``peer`` is busy until free_at[peer], then carries
        ``nbytes`` for nbytes / beta: when they arrive (ns), now its new free_at."""
        start = max(time.monotonic_ns(), free_at[peer])
        free_at[peer] = arrival = start + int(nbytes * self.ns_per_byte[peer])
        self.carried[peer] += nbytes
        return arrival

    def link_bytes(self) -> LinkBytes:
        """The bytes carried so far inside this rank's node and between nodes."""
        between = sum(n for n, far in zip(self.carried, self.remote) if far)
        return LinkBytes(sum(self.carried) - between, between)

    def arrived(self, arrival: int) -> bool:
        """Has a piece stamped ``arrival`` landed? If not, remember when it will."""
        if arrival <= time.monotonic_ns():
            return True
        if not self.next_arrival or arrival < self.next_arrival:
            self.next_arrival = arrival
        return False

    def sleep_until_next(self) -> bool:
        """Sleep until the earliest piece on the wire lands; False if none is."""
        arrival, self.next_arrival = self.next_arrival, 0
        if not arrival:
            return False
        delay = (arrival - time.monotonic_ns()) / 1e9
        if delay > 0:
            time.sleep(min(delay, MAX_NAP_S))
        return True

    def seconds_to_next(self, cap: float) -> float:
        """Seconds until the earliest piece seen on the wire lands, at most ``cap`` (all
        of it if none is). A peer rings a rank's doorbell when it publishes a piece, not
        when the piece lands, so a rank that sleeps on its doorbell with a piece on the
        wire sets its alarm by this: else it would sleep out the whole ``cap``."""
        if not self.next_arrival:
            return cap
        return min(cap, max(0.0, (self.next_arrival - time.monotonic_ns()) / 1e9))

    def stamp_read(self, src: int, nbytes: int) -> int:
        """The arrival time (ns) of ``nbytes`` asked of ``src`` now, after what was
        asked of it before."""
        return self._carry(self.read_free_at, src, nbytes)

    @staticmethod
    def sleep_until(arrival: int, check_abort) -> None:
        """Sleep (no CPU, no GIL) until ``arrival``; ``check_abort()`` between naps."""
        while True:
            delay = (arrival - time.monotonic_ns()) / 1e9
            if delay <= 0:
                return
            time.sleep(min(delay, MAX_NAP_S))
            check_abort()
