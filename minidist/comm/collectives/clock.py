"""One clock for a trace across machines: each rank's offset to rank 0's clock.

On one machine every process reads the same monotonic clock and the offset is
0. Under MPI the ranks may sit on different machines, so when a trace is
recorded each rank r > 0, in turn, asks rank 0 for its clock (Cristian's
algorithm)::

    t0 = my clock;  rank 0 replies with T, its clock;  t1 = my clock
    offset = T - (t0 + t1) / 2          (error at most (t1 - t0) / 2)

The best of ``ROUNDS`` exchanges (the shortest round trip) is kept. The merge
adds the offset to every timestamp of the rank (trace/merge.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from minidist import backend
from minidist.backend import xp

if TYPE_CHECKING:   # group.py calls clock_offset
    from minidist.comm.group import ProcessGroup

ROUNDS = 5
_TAG = (1 << 24) - 7   # a user tag no collective takes


def clock_offset(world: ProcessGroup) -> float:
    """Seconds to add to this rank's ``time.perf_counter`` to read rank 0's; every
    rank of ``world`` calls it."""
    best, offset = float("inf"), 0.0
    ping = xp.zeros(1, dtype="float64")
    for r in range(1, world.size):
        for _ in range(ROUNDS):
            if world.rank == 0:
                world.wait([world.irecv(ping, r, _TAG)])
                stamp = backend.from_host([time.perf_counter()], "float64")
                world.wait([world.isend(stamp, r, _TAG)])
            elif world.rank == r:
                t0 = time.perf_counter()
                world.wait([world.isend(ping, 0, _TAG)])
                reply = xp.zeros(1, dtype="float64")
                world.wait([world.irecv(reply, 0, _TAG)])
                t1 = time.perf_counter()
                if t1 - t0 < best:
                    best = t1 - t0
                    offset = float(backend.to_host(reply)[0]) - (t0 + t1) / 2
    return offset
