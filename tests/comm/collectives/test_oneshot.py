"""The latency path (oneshot.py on transport/board.py): an all-reduce that fits a
rank's slot on the board posts once and folds its peers' slots in place.

Its results are the one-process fold's, bit for bit, on every rank, for sizes
on both sides of the slot's capacity (the test worlds' 4 KiB), every dtype
and op, real-valued floats included (the fold order is the oracle's); calls on
overlapping groups and asynchronous calls share the one slot per rank safely;
a peer that never comes is named within the timeout, a mismatch refused; and
auto, at each of its switches (the board's capacity, gather_bytes, small_bytes),
gives the same bits on every rank, the oracle's.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World

from .. import cases
from ..conftest import TEST_SLOT_BYTES

BOARD = TEST_SLOT_BYTES   # the board's capacity in the test worlds: a channel slot


def _all_reduce_case(case):
    """Run one all-reduce case, maybe on a strided view; return (result, msgs sent)."""
    import minidist.distributed as dist
    from minidist import backend
    x = cases.inputs(case, dist.get_rank())
    op = getattr(dist.ReduceOp, case["op"])
    if case["strided"]:                              # a transposed view, written back
        t = backend.from_host(np.ascontiguousarray(x.reshape(2, -1).T)).T
        dist.all_reduce(t, op=op)
        out = backend.to_host(t).reshape(-1)
    else:
        t = backend.from_host(x)
        dist.all_reduce(t, op=op)
        out = backend.to_host(t)
    return out.copy(), dist.get_stats().last["msgs_sent"]


@st.composite
def near_the_board(draw, world):
    dtype = np.dtype(draw(st.sampled_from(cases.DTYPES)))
    edge = BOARD // dtype.itemsize                   # elements that fill the slot
    count = draw(st.sampled_from([0, 1, 2, 7, edge - 2, edge, edge + 2, 2 * edge]))
    count += count % 2                               # even: the strided case halves it
    return dict(collective="all_reduce", world=world, shape=(count,), dtype=dtype.name,
                op=draw(st.sampled_from(cases.OPS)), real=draw(st.booleans()),
                strided=draw(st.booleans()) and count > 0, seed=draw(st.integers(0, 2**30)))


@pytest.mark.parametrize("n", [2, 3, 4])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_one_shot_matches_the_rank_order_fold_bit_for_bit_on_every_rank(worlds, n, data):
    case = data.draw(near_the_board(n))
    want = cases.expected(case)[0]                   # folded left to right, as the board does
    nbytes = case["shape"][0] * np.dtype(case["dtype"]).itemsize
    for rank, (got, msgs) in enumerate(worlds.get(n).run(_all_reduce_case, case)):
        assert cases.same(got, want), f"rank {rank} of {case}:\n got {got}\n want {want}"
        board = nbytes <= BOARD
        assert msgs == (n - 1 if board else (n - 1).bit_length()), \
            f"rank {rank}: {msgs} messages, {'through' if board else 'around'} the board"


def _overlapping_groups(rounds):
    """Alternate small all-reduces on the world, on {0, 1} and on {1, ..., N-1},
    some asynchronous: one slot per rank serves them all."""
    import minidist.distributed as dist
    from minidist.backend import to_host, xp
    r, n = dist.get_rank(), dist.get_world_size()
    low, high = dist.new_group([0, 1]), dist.new_group(list(range(1, n)))
    got = []
    for i in range(rounds):
        x = xp.full(3 + i % 4, float(r + i))
        dist.all_reduce(x)
        got.append(float(to_host(x)[0]))
        if r in (0, 1):
            y = xp.full(5, float(r * i))
            work = dist.all_reduce(y, group=low, async_op=i % 2 == 1)
            if work is not None:
                work.wait()
            got.append(float(to_host(y)[0]))
        if r >= 1:
            z = xp.full(2, float(r))
            dist.all_reduce(z, op=dist.ReduceOp.MAX, group=high)
            got.append(float(to_host(z)[0]))
    return got


def test_calls_on_overlapping_groups_and_async_calls_share_the_slot(worlds):
    n, rounds = 4, 30
    per_rank = worlds.get(n).run(_overlapping_groups, rounds)
    for r, got in enumerate(per_rank):
        want = []
        for i in range(rounds):
            want.append(float(sum(q + i for q in range(n))))
            if r in (0, 1):
                want.append(float(0 * i + 1 * i))
            if r >= 1:
                want.append(float(n - 1))
        assert got == want, f"rank {r}"


def test_a_peer_that_never_posts_is_named_within_the_timeout():
    err = cases.named_within_the_timeout("all_reduce")
    assert err.rank in (0, 1)
    assert "rank 2 did not enter all_reduce" in err.remote_traceback


def _mismatch(kind):
    import minidist.distributed as dist
    from minidist.backend import xp
    odd = dist.get_rank() == 1
    try:
        if kind == "shape":
            dist.all_reduce(xp.ones(5 if odd else 4))
        elif kind == "broadcast":                         # another collective, no post
            if odd:
                dist.broadcast(xp.ones(4), src=0)
            else:
                dist.all_reduce(xp.ones(4))
    except (dist.CollectiveMismatchError, dist.MessageMismatchError) as e:
        error = f"{type(e).__name__}: {e}"
    else:
        error = None
    y = xp.ones(3)
    dist.all_reduce(y)                                    # the world goes on
    return error, float(y[0]), dist.get_stats().last["msgs_sent"]


@pytest.mark.parametrize("check", [True, False])
def test_a_mismatch_on_the_board_is_refused_on_every_rank(check):
    with World(3, timeout=5.0, run_timeout=60.0, check=check) as world:
        for error, later, msgs in world.run(_mismatch, "shape"):
            want = "CollectiveMismatchError" if check else "MessageMismatchError"
            assert error is not None and error.startswith(want), error
            assert later == 3.0 and msgs == 2            # and the next call takes the board
        if check:
            for error, later, msgs in world.run(_mismatch, "broadcast"):
                assert error is not None and "differ in" in error, error
                assert later == 3.0 and msgs == 2


@st.composite
def across_auto_thresholds(draw, world):
    """An all-reduce whose size lies at one of auto's switches (the board's
    capacity, gather_bytes / (N-1), small_bytes at N), one element either side or on it."""
    from minidist.comm.collectives import all_reduce
    dtype = np.dtype(draw(st.sampled_from(cases.DTYPES)))
    at = all_reduce.thresholds(world)
    edge = draw(st.sampled_from([BOARD, at.gather_bytes // (world - 1), at.small_bytes]))
    count = max(1, edge // dtype.itemsize + draw(st.sampled_from([-1, 0, 1])))
    return dict(collective="all_reduce", world=world, shape=(count,), dtype=dtype.name,
                op=draw(st.sampled_from(cases.OPS)), real=draw(st.booleans()), strided=False,
                seed=draw(st.integers(0, 2**30)))


def _all_reduce_taken(case):
    import minidist.distributed as dist
    got, _ = _all_reduce_case(case)
    return got, dist.get_stats().last["algorithm"]


@pytest.mark.parametrize("n", [2, 3, 4])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_auto_across_its_thresholds_is_bit_identical_on_every_rank(worlds, n, data):
    """On both sides of every switch of auto: the same bits on every rank, and
    the one-process fold's bits (exactly, for small integers in any order; for
    real floats where auto folds in rank order, as the all-gather does)."""
    case = data.draw(across_auto_thresholds(n))
    want = cases.expected(case)[0]
    results = worlds.get(n).run(_all_reduce_taken, case)
    first, taken = results[0]
    for rank, (got, algorithm) in enumerate(results):
        assert algorithm == taken and cases.same(got, first), f"rank {rank} of {case}"
    if not case["real"] or taken == "allgather":
        assert cases.same(first, want), f"{taken} on {case}:\n got {first}\n want {want}"


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=128, max_size=128), st.lists(st.binary(min_size=128, max_size=128),
                                                       min_size=1, max_size=3),
       st.integers(0, 3), st.integers(0, 127))
def test_the_same_call_check_word_by_word_agrees_with_comparing_copies(mine, peers, same, at):
    """oneshot._same_call compares the records in place, as 16 int64 words; the
    plain check (oneshot.check_posts) copies each one out (tobytes) and compares:
    the oracle. Some peers post my record, one maybe with one byte changed."""
    from types import SimpleNamespace

    import numpy as np
    from minidist.comm.collectives import oneshot
    peers = [mine if i < same else p for i, p in enumerate(peers)]
    if at < 128 and same and peers:   # one byte off in the first peer that copies mine
        changed = bytearray(peers[0])
        changed[at] ^= 0xFF
        peers[0] = bytes(changed)
    records = [np.frombuffer(bytearray(p), dtype=np.uint8) for p in peers]
    plan = SimpleNamespace(record_words=memoryview(mine).cast("Q"),
                           peer_words=[memoryview(r).cast("Q") for r in records])
    assert oneshot._same_call(plan) == all(r.tobytes() == mine for r in records)
