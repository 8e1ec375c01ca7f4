"""The same-call check finds every kind of mismatch, on every rank, whichever
mechanism each rank is in (check.py): a small all-reduce carries the check in
its own messages (small.py), the other collectives run it first. Afterwards
the world is still usable: nothing of the failed call is left in a channel.

Every pairing below runs at world sizes 2..8 in test_collectives.py, which
keeps a world of each size running.
"""
import pytest

from minidist.comm import RankFailedError, World

# (what most ranks call, what one rank calls instead, the field the error must name)
MISMATCHES = [
    ("small", "small_shape", "shape"),        # both fused, blocks of different sizes
    ("small", "small_dtype", "dtype"),        # both fused, same size: the records differ
    ("small", "small_op", "op"),
    ("small", "big", "shape"),                # a block spanning several slots, drained
    ("small", "ring", "algorithm"),           # fused against a separate check
    ("ring", "small", "algorithm"),
    ("small", "broadcast", "collective"),
    ("broadcast", "small", "collective"),
    ("broadcast", "broadcast_root", "src"),   # both with a separate check
    ("barrier", "small", "collective"),
    ("small", "empty", "shape"),              # a block of the record alone
]


def _call(kind):
    import minidist.distributed as dist
    from minidist.backend import xp
    x = xp.ones(4, dtype="float32")
    if kind == "small":
        dist.all_reduce(x)
    elif kind == "small_shape":
        dist.all_reduce(xp.ones(5, dtype="float32"))
    elif kind == "small_dtype":
        dist.all_reduce(xp.ones(4, dtype="int32"))
    elif kind == "small_op":
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    elif kind == "big":  # 12 KB, 3 slots of the test worlds' 4 KiB
        dist.all_reduce(xp.ones(3000, dtype="float32"), algorithm="allgather")
    elif kind == "empty":
        dist.all_reduce(xp.ones(0, dtype="float32"))
    elif kind == "ring":
        dist.all_reduce(x, algorithm="ring")
    elif kind == "broadcast":
        dist.broadcast(x, src=0)
    elif kind == "broadcast_root":
        dist.broadcast(x, src=1)
    elif kind == "barrier":
        dist.barrier()


def test_a_matching_call_after_a_mismatch_still_takes_the_short_way(worlds):
    def fn():
        import minidist.distributed as dist
        from minidist.backend import xp
        try:
            dist.all_reduce(xp.ones(4 + dist.get_rank()))
        except dist.CollectiveMismatchError:
            pass
        x = xp.ones(4)
        dist.all_reduce(x)
        return dist.get_stats().last
    for last in worlds.get(2).run(fn):
        assert last["algorithm"] == "allgather" and last["bytes_sent"] == 32


def _mismatches(mismatches, odd_ranks):
    """Run each mismatch; return per case (error text or None, sum of a later all-reduce)."""
    import minidist.distributed as dist
    from minidist import backend
    out = []
    for (usual, other, _), odd in zip(mismatches, odd_ranks):
        try:
            _call(other if dist.get_rank() == odd else usual)
            error = None
        except dist.CollectiveMismatchError as e:
            error = str(e)
        y = backend.xp.ones(3)
        dist.all_reduce(y)  # the world is still usable
        out.append((error, float(backend.to_host(y)[0])))
    return out


def _shape_mismatch_unchecked():
    import minidist.distributed as dist
    from minidist.backend import xp
    dist.all_reduce(xp.ones(4 + dist.get_rank()))


def test_without_the_check_a_small_all_reduce_of_another_size_still_raises():
    with World(2, timeout=5.0, check=False) as world:
        with pytest.raises(RankFailedError) as info:
            world.run(_shape_mismatch_unchecked)
    assert info.value.exc_type == "MessageMismatchError"
    assert "another size" in info.value.remote_traceback
