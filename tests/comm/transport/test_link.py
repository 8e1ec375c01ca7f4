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


def test_the_link_counts_bytes_inside_the_node_and_between_nodes():
    link = EmulatedLink(1_000, world_size=4, rank=1, node_size=2, inter_bytes_per_s=10)
    link.stamp(0, 100)                           # rank 0: same node
    link.stamp(2, 30)                            # rank 2: the other node
    link.stamp_read(3, 5)                        # read from rank 3: the other node
    assert link.link_bytes() == (100, 35)
    one_level = EmulatedLink(1_000, world_size=2, rank=0)
    one_level.stamp(1, 7)
    assert one_level.link_bytes() == (7, 0)


def _link_bytes_around(algorithm):
    import minidist.distributed as dist
    from minidist import backend
    x = backend.xp.ones(100_000, dtype="float32")
    before, sent = dist.get_link_bytes(), dist.get_stats().bytes_sent
    dist.all_reduce(x, algorithm=algorithm)
    after = dist.get_link_bytes()
    return after.inside - before.inside, after.between - before.between, \
        dist.get_stats().bytes_sent - sent


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_every_byte_a_collective_sends_is_counted_on_one_link(algorithm):
    """2 nodes x 2 ranks: the bytes on the links, inside and between nodes, add up to
    the bytes the collective says it sent, plus the same-call check's records (at most
    128 bytes x N rows x log2 N rounds, comm/collectives/check.py); between nodes the
    ring's two crossing links carry 2(N-1)/N * M each, the hierarchical all-reduce
    2(K-1)/K * M/L per rank (K = 2 nodes, L = 2 ranks per node)."""
    with World(4, node_size=2, link_gbps=100.0, inter_node_gbps=50.0, timeout=20.0,
               run_timeout=60.0) as world:
        results = world.run(_link_bytes_around, algorithm)
    records = 128 * 4 * 2
    for inside, between, sent in results:
        assert 0 <= inside + between - sent <= records
    between = sum(b for _, b, _ in results)
    m = 400_000
    want = 2 * 1.5 * m if algorithm == "ring" else 4 * 2 * (1 / 2) * m / 2
    assert want <= between <= want + 4 * records


def _doorbell_nap_with_a_piece_on_the_wire(nbytes, late=False):
    """Rank 1 sends ``nbytes``; rank 0 waits until the piece is published (its ring has
    come already), then sleeps on its doorbell: (the alarms it asked, s; when the
    piece lands, ns). ``late``: rank 0 goes to sleep first, and the piece is published
    while it reads its doorbell (rank 1 sends 50 ms after a barrier)."""
    import time

    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.group import world_group
    from minidist.comm.transport.shm import S_ARRIVAL
    t = world_group().transport
    if late:
        dist.barrier()
    if dist.get_rank() == 1:
        if late:
            time.sleep(0.05)
        dist.send(xp.ones(nbytes // 8), dst=0)
        return None
    ch = t._in[1]

    def published():
        while t._words[ch.head_i] == ch.count:   # not yet published
            time.sleep(1e-4)
        return t._words[ch.hdr_i[ch.count % t.nslots] + S_ARRIVAL]
    arrival = None if late else published()
    out = xp.empty(nbytes // 8)
    handle = t.irecv(out, 1, tag=0)
    naps, wait, mark = [], t._bells.wait, t.news_mark
    t._bells.wait = lambda rank, seen, timeout: naps.append(timeout)   # the alarm asked
    if late:            # the peer publishes (and rings) just as the doorbell is read
        def news_mark():
            nonlocal arrival
            arrival = published()
            return mark()
        t.news_mark = news_mark
    try:
        t._sleep([handle])                       # no peer will ring again
    finally:
        t._bells.wait, t.news_mark = wait, mark
    t.wait_all([handle])
    return naps, arrival


def test_a_doorbell_sleep_ends_when_the_piece_on_the_wire_lands():
    """A peer rings a rank's doorbell when it publishes a piece, not when the piece
    lands: a rank that goes to sleep on its doorbell after that ring, the piece still on
    the wire, must set its alarm by the arrival (local_wait.py), not sleep out the
    doorbell's 50 ms (that cost DiLoCo with DDP inside ~4 ms a step in
    bench/bench_diloco.py). 8 KB at 0.4 MB/s: 20 ms on the wire."""
    with World(2, link_gbps=0.0004, timeout=20.0, run_timeout=60.0, check=False) as world:
        naps, arrival = world.run(_doorbell_nap_with_a_piece_on_the_wire, 8_000)[0]
    # the alarm is what is left of the piece's 20 ms on the wire, never the doorbell's
    # own 50 ms (no wall-clock bound: a loaded machine may run the rank late)
    assert all(nap < 0.05 for nap in naps), (naps, arrival)


def test_a_doorbell_sleep_ends_when_a_piece_published_as_it_reads_its_doorbell_lands():
    """The same when the ring comes between the rank's look at the wire and its read of
    the doorbell: the ring is counted in the mark it sleeps on, so its alarm must be set
    after that read, by the piece then on the wire, not by the empty wire it saw before."""
    with World(2, link_gbps=0.0004, timeout=20.0, run_timeout=60.0, check=False) as world:
        naps, arrival = world.run(_doorbell_nap_with_a_piece_on_the_wire, 8_000, True)[0]
    assert all(nap < 0.05 for nap in naps), (naps, arrival)
