"""all_to_all_single through the board in rounds (alltoall_rounds.py): at 4
ranks an input larger than a slot goes through it a piece a round, up to
STREAM_BYTES per rank; beyond, or at 2 and 3 ranks, the parts move off the
board. Every way gives the NumPy reference's bits on every rank; a
disagreement is refused on every rank before a later round, and a peer that
stops between rounds is named within the timeout."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .test_alltoall import _expected, _run

SLOT = 256 * 1024   # alltoall_rounds.STREAM_MIN_SLOT: the smallest slot that takes rounds
ROOM = SLOT - 128   # the counts take the first cache lines (2N + 3 words, at N <= 4)
STREAM = {2: 0, 3: 0, 4: 4 * 1024 * 1024}   # alltoall_rounds.STREAM_BYTES, per world size


def _run_watched(case):
    """``_run``, noting which way the parts went: 'board' (one post), 'rounds', 'moved'."""
    from minidist.comm.collectives import alltoall_rounds, api
    way = ["board"]
    move, stream = api._move_parts, alltoall_rounds.stream

    def moved(*args):
        way[0] = "moved"
        move(*args)

    def in_rounds(*args):
        way[0] = "rounds"
        stream(*args)
    api._move_parts, alltoall_rounds.stream = moved, in_rounds
    try:
        got, last = _run(case)
    finally:
        api._move_parts, alltoall_rounds.stream = move, stream
    return got, last, way[0]


def _expected_way(case, n):
    row_bytes = np.dtype(case["dtype"]).itemsize * int(np.prod(case["row_shape"]))
    totals = [sum(row) * row_bytes for row in case["S"]]
    if max(totals) <= ROOM:
        return "board"
    return "rounds" if max(totals) <= STREAM[n] else "moved"


def _check(worlds, n, case):
    way = _expected_way(case, n)
    row_bytes = np.dtype(case["dtype"]).itemsize * int(np.prod(case["row_shape"]))
    for rank, (got, last, went) in enumerate(worlds.get(n, slot_bytes=SLOT)
                                             .run(_run_watched, case)):
        assert np.array_equal(got, _expected(case, rank)), f"rank {rank} of {case}"
        assert went == way, f"rank {rank}: went {went}, expected {way}"
        sent = sum(case["S"][rank]) - case["S"][rank][rank]
        assert last["bytes_sent"] == sent * row_bytes


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_all_to_all_in_rounds_matches_numpy_reference_across_the_thresholds(worlds, data):
    n = data.draw(st.sampled_from([2, 3, 4, 4, 4]))
    sizes = [0, 1, 7, 3000, 20000, 70000, 300000]       # rows: from one post to many rounds
    case = dict(S=[[data.draw(st.sampled_from(sizes)) for _ in range(n)] for _ in range(n)],
                row_shape=data.draw(st.sampled_from([(), (3,)])),
                dtype=data.draw(st.sampled_from(["float32", "float64", "int32"])),
                seed=data.draw(st.integers(0, 999)))
    _check(worlds, n, case)


def test_a_rank_over_stream_bytes_moves_every_part_off_the_board(worlds):
    # rank 0 sends 4.8 MB (over 4 MiB), the others less: every rank moves its parts
    case = dict(S=[[300000] * 4, [1, 7, 0, 70000], [3000, 0, 300000, 1], [0, 0, 0, 0]],
                row_shape=(), dtype="float32", seed=3)
    assert _expected_way(case, 4) == "moved"
    _check(worlds, 4, case)


def _large_splits_disagree():
    import minidist.distributed as dist
    from minidist.backend import xp
    r = dist.get_rank()
    rows = 4 * 200000                      # 3.2 MB of float32: rounds at 4 ranks
    x, out = xp.ones(rows, dtype="float32"), xp.zeros(rows, dtype="float32")
    splits = [rows // 4] * 4
    wrong = [rows // 4 + 1, rows // 4 - 1, rows // 4, rows // 4]
    try:
        # rank 1 says it sends rows/4 + 1 rows to rank 0, which expects rows/4
        dist.all_to_all_single(out, x, splits, wrong if r == 1 else splits)
    except dist.CollectiveMismatchError as e:
        error = str(e)
    else:
        error = None
    dist.all_to_all_single(out, xp.full(rows, float(r), dtype="float32"))  # the world goes on
    return error, [float(out[k * rows // 4]) for k in range(4)]


def test_splits_that_disagree_in_rounds_raise_on_every_rank(worlds):
    for rank, (error, later) in enumerate(worlds.get(4, slot_bytes=SLOT)
                                          .run(_large_splits_disagree)):
        assert error is not None and "rank 1 sends 200001 rows to rank 0, which expects " \
            "200000" in error, error
        assert later == [0.0, 1.0, 2.0, 3.0]


def _rank_3_stops_after_round_0():
    """Rank 3 posts round 0 of a call in rounds, then never posts round 1."""
    import time

    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives import alltoall_rounds
    if dist.get_rank() == 3:
        alltoall_rounds.stream = lambda *args: time.sleep(6.0)
    rows = 4 * 200000
    dist.all_to_all_single(xp.zeros(rows, dtype="float32"), xp.ones(rows, dtype="float32"))


def test_a_peer_that_stops_between_rounds_is_named_within_the_timeout():
    from minidist.comm import RankFailedError, World
    with World(4, timeout=2.0, run_timeout=60.0, slot_bytes=SLOT) as world:
        with pytest.raises(RankFailedError) as info:
            world.run(_rank_3_stops_after_round_0)
    err = info.value
    assert err.exc_type == "CommTimeoutError", err.remote_traceback
    assert err.rank in (0, 1, 2)
    assert "ranks [3]" in err.remote_traceback, err.remote_traceback   # its post or its ack
