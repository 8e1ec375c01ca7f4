"""The emulated link (comm/transport/link.py): pieces land n / beta after they are sent,
the results do not change, and a bad rate is refused by name."""
import time

import numpy as np
import pytest

from minidist.comm import World
from minidist.comm.transport.link import ENV, EmulatedLink, link_bytes_per_s


def test_rate_comes_from_the_argument_or_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert link_bytes_per_s(None) == 0
    assert link_bytes_per_s(2.5) == 2_500_000_000
    monkeypatch.setenv(ENV, "0.5")
    assert link_bytes_per_s(None) == 500_000_000
    assert link_bytes_per_s(0) == 0  # the argument wins over the environment


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_rate_is_refused(bad):
    with pytest.raises(ValueError, match="link_gbps"):
        link_bytes_per_s(bad)


def test_a_bad_environment_value_is_named(monkeypatch):
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(ValueError, match=ENV):
        link_bytes_per_s(None)


def test_pieces_queue_behind_each_other_on_one_link_only():
    link = EmulatedLink(1_000_000_000, world_size=3)  # 1 byte per ns
    first = link.stamp(1, 1_000_000)
    second = link.stamp(1, 1_000_000)
    other = link.stamp(2, 1_000_000)
    assert second - first == 1_000_000          # waits for the first to clear the wire
    assert other - first < 1_000_000            # another pair's link is free
    assert not link.arrived(second) and link.next_arrival == second
    assert link.arrived(time.monotonic_ns())


def _timed_all_reduce(count):
    import time

    import minidist.distributed as dist
    from minidist import backend
    x = backend.xp.ones(count, dtype="float32") * (dist.get_rank() + 1)
    dist.barrier()
    t = time.perf_counter()
    dist.all_reduce(x, algorithm="ring")
    return time.perf_counter() - t, backend.to_host(x)


def test_a_ring_all_reduce_takes_at_least_its_wire_time():
    count, gbps, n = 250_000, 0.1, 2  # 1 MB of float32 at 0.1 GB/s
    with World(n, link_gbps=gbps, timeout=20.0, run_timeout=60.0) as world:
        results = world.run(_timed_all_reduce, count)
    wire_s = 2 * (n - 1) / n * 4 * count / (gbps * 1e9)  # bytes each rank sends / beta
    for seconds, x in results:
        np.testing.assert_array_equal(x, np.full(count, 3.0, np.float32))
        assert seconds >= 0.95 * wire_s  # the emulation cannot be faster than its link


def test_async_work_restores_the_switch_interval(worlds):
    results = worlds.get(2).run(_switch_interval_around_async)
    assert results[0] == (True, True)      # rank 0's work waits for rank 1: still queued
    assert results[1][1]


def _switch_interval_around_async():
    import sys
    import time

    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives.work import SWITCH_S
    before = sys.getswitchinterval()
    time.sleep(0.2 * dist.get_rank())     # rank 1 comes late
    w = dist.all_reduce(xp.ones(10_000), async_op=True)
    during = sys.getswitchinterval()
    w.wait()
    return abs(during - SWITCH_S) < 1e-9, sys.getswitchinterval() == before
