"""Point-to-point on the local transport: send/recv into the caller's buffer,
isend/irecv handles, the fused receive-and-reduce, tags, pipelining of
messages larger than the channel, and errors that name the peer and tag."""
import numpy as np
import pytest

from minidist.comm.errors import RankFailedError

from .. import cases


def _roundtrip(n, dtype):
    import minidist.distributed as dist
    from minidist import backend
    rank = dist.get_rank()
    data = backend.from_host(np.arange(n).astype(dtype))
    if rank == 0:
        dist.send(data, dst=1, tag=3)
        return None
    out = backend.xp.zeros(n, dtype=dtype)
    dist.recv(out, src=0, tag=3)
    return backend.to_host(out).copy()


@pytest.mark.parametrize("n", [0, 1, 1000, 50_000])  # 50k float64: 100 slots of 4 KiB
@pytest.mark.parametrize("dtype", ["float16", "float64", "int32"])
def test_recv_fills_the_callers_buffer(worlds, n, dtype):
    got = worlds.get(2).run(_roundtrip, n, dtype)[1]
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, np.arange(n).astype(dtype))


def _both_send_first(n):
    import minidist.distributed as dist
    from minidist import backend
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    mine = backend.from_host(np.full(n, rank, dtype=np.float32))
    theirs = backend.xp.zeros(n, dtype="float32")
    h = dist.isend(mine, dst=peer, tag=1)      # posted, not waited: no deadlock
    dist.recv(theirs, src=peer, tag=1)
    h.wait()
    return float(backend.to_host(theirs).sum())


def test_isend_then_recv_does_not_deadlock_on_large_messages(worlds):
    n = 100_000  # 400 KB each way, 25x the channel
    assert worlds.get(2).run(_both_send_first, n) == [n * 1.0, 0.0]


def _recv_reduce(n):
    import minidist.distributed as dist
    from minidist import backend
    x = backend.from_host(np.arange(n, dtype=np.float64))
    if dist.get_rank() == 0:
        dist.send(x, dst=1)
        return None
    dist.recv_reduce(x, src=0, op=dist.ReduceOp.SUM)
    return backend.to_host(x).copy()


def test_recv_reduce_adds_into_the_local_buffer(worlds):
    got = worlds.get(2).run(_recv_reduce, 9000)[1]
    assert np.array_equal(got, 2 * np.arange(9000.0))


def _out_of_order_tags():
    import minidist.distributed as dist
    from minidist import backend
    xp = backend.xp
    if dist.get_rank() == 0:
        for tag in (5, 6, 7):
            dist.send(xp.full(3000, float(tag)), dst=1, tag=tag)
        return None
    got = {}
    for tag in (7, 5, 6):  # 5 and 6 arrive first and wait in the unexpected queue
        buf = xp.zeros(3000)
        dist.recv(buf, src=0, tag=tag)
        got[tag] = float(backend.to_host(buf)[0])
    return got


def test_messages_are_matched_by_tag(worlds):
    assert worlds.get(2).run(_out_of_order_tags)[1] == {5: 5.0, 6: 6.0, 7: 7.0}


def _send_to_self():
    import minidist.distributed as dist
    from minidist import backend
    xp = backend.xp
    r = dist.get_rank()
    out = xp.zeros(10)
    h = dist.isend(xp.ones(10) * r, dst=r)
    dist.recv(out, src=r)
    h.wait()
    return float(backend.to_host(out)[0])


def test_a_rank_can_send_to_itself(worlds):
    assert worlds.get(2).run(_send_to_self) == [0.0, 1.0]


def _wrong_size():
    import minidist.distributed as dist
    from minidist.backend import xp
    if dist.get_rank() == 0:
        dist.send(xp.ones(4, dtype="float32"), dst=1, tag=2)
    else:
        dist.recv(xp.ones(5, dtype="float32"), src=0, tag=2)


def test_a_message_of_the_wrong_size_is_an_error():
    from minidist.comm import World
    with World(2, timeout=5.0) as world:
        with pytest.raises(RankFailedError) as info:
            world.run(_wrong_size)
    err = info.value
    assert err.rank == 1 and err.exc_type == "MessageMismatchError"
    assert "16 bytes of <f4" in err.remote_traceback and "expects 20 bytes" in err.remote_traceback


def test_a_small_recv_from_a_peer_that_never_sends_is_named_within_the_timeout():
    """The blocking recv of a message that fits a slot polls the channel itself
    (short_way.py): it still gives up after the timeout, naming the peer."""
    err = cases.named_within_the_timeout("send")
    assert err.rank == 0
    assert "in recv from rank 2" in err.remote_traceback, err.remote_traceback


def _sendrecv_when_things_are_unusual(case, n):
    """Rank 0 makes one sendrecv with rank 1 (tag 5) while rank 1 makes it unusual:
    another message first, or a pause in the middle of its message."""
    import time

    from minidist import backend
    from minidist.comm.group import world_group
    from minidist.comm.transport.reduce_op import ReduceOp
    g = world_group()
    xp, peer = backend.xp, 1 - g.rank
    mine = xp.arange(n, dtype="float64") * (g.rank + 1)
    got = xp.ones(n, dtype="float64")
    if g.rank == 0:
        g.sendrecv(mine, peer, got, peer, tag=5, op=ReduceOp.SUM)   # got = 1 + theirs
        extra = xp.zeros(3)
        if case == "another message first":
            g.wait([g.irecv(extra, peer, tag=99)])
        return backend.to_host(got).tolist(), backend.to_host(extra).tolist()
    if case == "another message first":
        g.wait([g.isend(xp.full(3, 7.0), peer, tag=99)])    # arrives before tag 5
    h = g.isend(mine, peer, tag=5)                          # pushes what fits, no more
    if case == "a pause mid-message":
        time.sleep(0.05)                                    # rank 0 gives up the short way
    g.wait([h, g.irecv(got, peer, tag=5)])
    return backend.to_host(got).tolist(), None


@pytest.mark.parametrize("case", ["another message first", "a pause mid-message"])
@pytest.mark.parametrize("n", [0, 3, 10_000])  # 10k float64: 20 pieces, 4 fit in the channel
def test_sendrecv_hands_over_to_the_general_way_without_losing_a_byte(worlds, case, n):
    (got0, extra), (got1, _) = worlds.get(2).run(_sendrecv_when_things_are_unusual, case, n)
    assert got0 == (1 + 2 * np.arange(n, dtype=np.float64)).tolist()
    assert got1 == np.arange(n, dtype=np.float64).tolist()
    if case == "another message first":
        assert extra == [7.0, 7.0, 7.0]


def _sendrecv_whose_receive_finishes_first():
    """Rank 0's sendrecv gets its (small) message at once but cannot finish its
    (large) send until rank 1 drains it, 50 ms later; meanwhile rank 1 sends a
    second message with the same tag. It must go to the next receive."""
    import time

    from minidist import backend
    from minidist.comm.group import world_group
    g = world_group()
    xp, peer = backend.xp, 1 - g.rank
    big = xp.arange(10_000, dtype="float64")            # 20 pieces; 4 fit in the channel
    if g.rank == 0:
        first, second = xp.zeros(3), xp.zeros(3)
        g.sendrecv(big, peer, first, peer, tag=5)
        g.wait([g.irecv(second, peer, tag=5)])
        return backend.to_host(first).tolist(), backend.to_host(second).tolist()
    g.wait([g.isend(xp.full(3, 1.0), peer, tag=5)])
    time.sleep(0.05)                                    # rank 0 hands over to the general way
    g.wait([g.isend(xp.full(3, 2.0), peer, tag=5)])     # right behind the first message
    got = xp.zeros(10_000, dtype="float64")
    g.wait([g.irecv(got, peer, tag=5)])
    return bool((got == big).all())


def test_a_finished_receive_takes_no_piece_of_the_next_message(worlds):
    (first, second), ok = worlds.get(2).run(_sendrecv_whose_receive_finishes_first)
    assert first == [1.0] * 3 and second == [2.0] * 3 and ok


def _recv_whole_then_in_pieces_then_out_of_order(count):
    """A blocking recv takes a whole one-slot message straight from the channel
    (short_way.recv), and hands anything else to the general way: a message in
    pieces, or one whose tag is not the first in the channel."""
    import minidist.distributed as dist
    from minidist.backend import to_host, xp
    r = dist.get_rank()
    if r == 0:
        for tag, n in ((1, 3), (2, count), (4, 5), (3, 7)):
            dist.send(xp.full(n, float(tag)), 1, tag=tag)
        return None
    got = []
    for tag, n in ((1, 3), (2, count), (3, 7), (4, 5)):   # 3 before 4: out of order
        x = xp.zeros(n)
        dist.recv(x, 0, tag=tag)
        got.append((tag, to_host(x).tolist() == [float(tag)] * n))
    return got, dist.get_stats().msgs_recv


def test_blocking_recv_takes_whole_messages_and_hands_the_rest_over(worlds):
    count = 3 * 4096 // 8                         # float64 over three 4 KiB slots
    _, (got, msgs) = worlds.get(2).run(_recv_whole_then_in_pieces_then_out_of_order, count)
    assert got == [(1, True), (2, True), (3, True), (4, True)]
    assert msgs >= 4
