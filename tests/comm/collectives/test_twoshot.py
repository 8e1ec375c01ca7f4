"""The two-shot all-reduce (twoshot.py on transport/board.py): every rank posts
its array, reduces its chunk of everyone's in rank order, flags it, and copies
the others' chunks out.

Its results are the one-process fold's, bit for bit, on every rank, for sizes
on both sides of the slot's capacity (the test worlds' 4 KiB: one round, two,
several) and of N elements (chunks of nothing), every dtype and op, real-valued
floats included (each chunk is folded in rank order, as the oracle folds);
auto takes it between its thresholds and gives the same bits; a peer that
never comes is named within the timeout, a mismatch refused on every rank.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import RankFailedError, World

from .. import cases
from ..conftest import TEST_SLOT_BYTES

BOARD = TEST_SLOT_BYTES   # the board's capacity in the test worlds: a channel slot


def _twoshot_case(case):
    """Run one all-reduce case with ``algorithm``, maybe on a strided view;
    return (result, the stats of the call)."""
    import minidist.distributed as dist
    from minidist import backend
    x = cases.inputs(case, dist.get_rank())
    op = getattr(dist.ReduceOp, case["op"])
    if case["strided"]:                              # a transposed view, written back
        t = backend.from_host(np.ascontiguousarray(x.reshape(2, -1).T)).T
        dist.all_reduce(t, op=op, algorithm=case["algorithm"])
        out = backend.to_host(t).reshape(-1)
    else:
        t = backend.from_host(x)
        dist.all_reduce(t, op=op, algorithm=case["algorithm"])
        out = backend.to_host(t)
    return out.copy(), dict(dist.get_stats().last)


@st.composite
def across_the_slot(draw, world, algorithm="twoshot"):
    """An array of a size about the board's capacity (0, 1, 2, 3 ... rounds) or
    about N elements, of any dtype and op."""
    dtype = np.dtype(draw(st.sampled_from(cases.DTYPES)))
    edge = BOARD // dtype.itemsize                   # elements that fill the slot
    count = draw(st.sampled_from([0, 1, 2, world - 1, world, world + 1, 7, edge - 2, edge,
                                  edge + 2, 2 * edge + world, 3 * edge - 1]))
    count += count % 2                               # even: the strided case halves it
    return dict(collective="all_reduce", world=world, shape=(count,), dtype=dtype.name,
                op=draw(st.sampled_from(cases.OPS)), real=draw(st.booleans()),
                strided=draw(st.booleans()) and count > 0, seed=draw(st.integers(0, 2**30)),
                algorithm=algorithm)


@pytest.mark.parametrize("n", [2, 3, 4])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_two_shot_matches_the_rank_order_fold_bit_for_bit_on_every_rank(worlds, n, data):
    case = data.draw(across_the_slot(n))
    want = cases.expected(case)[0]                   # folded left to right, chunk by chunk
    count = case["shape"][0]
    rounds = max(1, -(-count * np.dtype(case["dtype"]).itemsize // BOARD))
    for rank, (got, last) in enumerate(worlds.get(n).run(_twoshot_case, case)):
        assert cases.same(got, want), f"rank {rank} of {case}:\n got {got}\n want {want}"
        assert last["algorithm"] == "twoshot"
        assert last["msgs_sent"] == 2 * (n - 1) * rounds, f"rank {rank}: {last}"


def test_two_shot_moves_2_n_minus_1_over_n_of_the_array():
    """Each rank's peers read (N-1)/N M of its posted array, then its reduced
    chunk, N-1 times: 2(N-1)/N M in all, as the ring sends."""
    n, count = 4, 4000                               # 16000 B of float32: 4 rounds
    case = dict(collective="all_reduce", world=n, shape=(count,), dtype="float32", op="SUM",
                real=False, strided=False, seed=1, algorithm="twoshot")
    with World(n, timeout=10.0, slot_bytes=BOARD, nslots=4, run_timeout=60.0) as world:
        for got, last in world.run(_twoshot_case, case):
            assert last["bytes_sent"] == 2 * (n - 1) * count * 4 // n == last["bytes_recv"]


def _auto_at(case, twoshot_bytes, gather_bytes):
    """auto with the two-shot between the all-gather and the rest (thresholds set here)."""
    from minidist.comm.collectives import all_reduce
    at = all_reduce.thresholds(case["world"])
    all_reduce.THRESHOLDS[case["world"]] = at._replace(gather_bytes=gather_bytes,
                                                       twoshot_bytes=twoshot_bytes)
    try:
        return _twoshot_case(case)
    finally:
        all_reduce.THRESHOLDS[case["world"]] = at


@pytest.mark.parametrize("n", [3, 4])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_auto_across_the_two_shot_thresholds_is_bit_identical_on_every_rank(worlds, n, data):
    """auto set to take the two-shot from (N-1) M > 1 KiB while M < 2 slots: on
    both sides of each switch, the same bits on every rank, the oracle's."""
    dtype = np.dtype(draw_dtype := data.draw(st.sampled_from(cases.DTYPES)))
    gather, twoshot = 1024, 2 * BOARD
    edge = data.draw(st.sampled_from([gather // (n - 1), twoshot])) // dtype.itemsize
    count = max(1, edge + data.draw(st.sampled_from([-1, 0, 1])))
    case = dict(collective="all_reduce", world=n, shape=(count,), dtype=draw_dtype,
                op=data.draw(st.sampled_from(cases.OPS)), real=data.draw(st.booleans()),
                strided=False, seed=data.draw(st.integers(0, 2**30)), algorithm="auto")
    want = cases.expected(case)[0]
    results = worlds.get(n).run(_auto_at, case, twoshot, gather)
    first, taken = results[0][0], results[0][1]["algorithm"]
    nbytes = count * dtype.itemsize
    if (n - 1) * nbytes <= gather:
        assert taken == "allgather", case
    elif nbytes < twoshot:
        assert taken == "twoshot", case
    else:                                            # the others' thresholds decide
        assert taken not in ("allgather", "twoshot"), case
    for rank, (got, last) in enumerate(results):
        assert last["algorithm"] == taken and cases.same(got, first), f"rank {rank} of {case}"
    if not case["real"] or taken in ("allgather", "twoshot"):
        assert cases.same(first, want), f"{taken} on {case}:\n got {first}\n want {want}"


def _rank_2_never_comes(count):
    import time
    import minidist.distributed as dist
    from minidist.backend import xp
    if dist.get_rank() == 2:
        time.sleep(30)
    else:
        dist.all_reduce(xp.ones(count), algorithm="twoshot")


@pytest.mark.parametrize("count", [3, 3 * BOARD // 8])   # one round; three
def test_a_peer_that_never_posts_is_named_within_the_timeout(count):
    with World(3, timeout=2.0, run_timeout=60.0, slot_bytes=BOARD, nslots=4) as world:
        with pytest.raises(RankFailedError) as info:
            world.run(_rank_2_never_comes, count)
    err = info.value
    assert err.exc_type == "CommTimeoutError", err.remote_traceback
    assert err.rank in (0, 1)
    assert "rank 2 did not enter all_reduce" in err.remote_traceback


def _dies_between_the_flags():
    """Rank 2 posts round 0 and exits before its second flag (the reduce of
    its chunk raises): the others, waiting for that flag, are told."""
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives import twoshot
    if dist.get_rank() == 2:
        def broken(*args):
            raise RuntimeError("rank 2 dies between the two flags")
        twoshot.finish = broken
    dist.all_reduce(xp.ones(3), algorithm="twoshot")


def test_a_peer_that_dies_between_the_flags_is_named():
    with World(3, timeout=5.0, run_timeout=60.0) as world:
        with pytest.raises(RankFailedError) as info:
            world.run(_dies_between_the_flags)
    assert info.value.rank == 2
    assert "dies between the two flags" in info.value.remote_traceback


def _mismatch(kind):
    import minidist.distributed as dist
    from minidist.backend import xp
    odd = dist.get_rank() == 1
    try:
        if kind == "shape":
            dist.all_reduce(xp.ones(5 if odd else 4), algorithm="twoshot")
        elif kind == "one-shot":                          # the same size, the other board way
            dist.all_reduce(xp.ones(4), algorithm="allgather" if odd else "twoshot")
        elif kind == "broadcast":                         # another collective, no post
            if odd:
                dist.broadcast(xp.ones(4), src=0)
            else:
                dist.all_reduce(xp.ones(4), algorithm="twoshot")
    except (dist.CollectiveMismatchError, dist.MessageMismatchError) as e:
        error = f"{type(e).__name__}: {e}"
    else:
        error = None
    y = xp.ones(3)
    dist.all_reduce(y, algorithm="twoshot")               # the world goes on
    return error, float(y[0]), dist.get_stats().last["msgs_sent"]


@pytest.mark.parametrize("check", [True, False])
def test_a_mismatch_on_the_two_shot_is_refused_on_every_rank(check):
    with World(3, timeout=5.0, run_timeout=60.0, check=check) as world:
        for error, later, msgs in world.run(_mismatch, "shape"):
            want = "CollectiveMismatchError" if check else "MessageMismatchError"
            assert error is not None and error.startswith(want), error
            assert later == 3.0 and msgs == 4            # and the next call takes the board
        if check:
            for kind in ("one-shot", "broadcast"):
                for error, later, msgs in world.run(_mismatch, kind):
                    assert error is not None and "differ in" in error, (kind, error)
                    assert later == 3.0 and msgs == 4


def _no_board():
    import minidist.distributed as dist
    from minidist.backend import xp
    with pytest.raises(ValueError, match="no board"):
        dist.all_reduce(xp.ones(4), algorithm="twoshot")
    y = xp.ones(1 << 16)
    dist.all_reduce(y)                                    # auto takes the ring there
    return float(y[0]), dist.get_stats().last["algorithm"]


def test_without_a_board_an_explicit_two_shot_is_refused_and_auto_takes_the_ring(monkeypatch):
    monkeypatch.setenv("MINIDIST_BOARD", "0")
    with World(4, timeout=5.0, run_timeout=60.0) as world:
        for value, taken in world.run(_no_board):
            assert value == 4.0 and taken != "twoshot"
