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

The receiver does not take a piece before its arrival time, and a rank that
waits only for pieces still on the wire sleeps until the first of them lands
(no CPU used). The links are full duplex and independent: rank r sending to
r+1 does not slow r+1 sending to r.

Turn it on with ``World(n, link_gbps=2.0)`` or ``MINIDIST_LINK_GBPS=2`` (in
GB/s, 1e9 bytes per second); the default is off. It is part of the segment's
header, so every rank of a world sees the same link. The times are
``time.monotonic_ns()``, one clock for every process of the machine.
"""
from __future__ import annotations

import os
import time

ENV = "MINIDIST_LINK_GBPS"
MAX_NAP_S = 0.05  # a waiting rank still looks at the abort flag this often


def link_bytes_per_s(link_gbps: float | None) -> int:
    """The link rate in bytes per second (0: no emulated link), from the
    argument or, if that is None, from ``MINIDIST_LINK_GBPS``."""
    if link_gbps is None:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return 0
        try:
            link_gbps = float(text)
        except ValueError:
            raise ValueError(f"{ENV}={text!r} is not a number of GB/s") from None
    if not link_gbps >= 0 or link_gbps == float("inf"):
        raise ValueError(f"link_gbps must be a finite number >= 0 (0: off), got {link_gbps}")
    return int(link_gbps * 1e9)


class EmulatedLink:
    """The outgoing links of one rank, and the earliest piece it waits for."""

    def __init__(self, bytes_per_s: int, world_size: int):
        self.ns_per_byte = 1e9 / bytes_per_s
        self.free_at = [0] * world_size  # dst -> when its link has carried everything sent
        self.next_arrival = 0            # earliest arrival seen on the wire (0: none)

    def stamp(self, dst: int, nbytes: int) -> int:
        """The arrival time (ns) of ``nbytes`` sent now to ``dst``."""
        start = max(time.monotonic_ns(), self.free_at[dst])
        self.free_at[dst] = arrival = start + int(nbytes * self.ns_per_byte)
        return arrival

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
