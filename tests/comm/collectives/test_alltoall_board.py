"""all_to_all_single through the board (alltoall_board.py): uneven splits of
inputs that fit a slot move in one post and N-1 copies out of the slots;
when any input does not fit, every rank moves the parts the other way, with
the splits as posted. Either way the result is the NumPy reference's, on
every rank, and a disagreement is refused on every rank."""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from .. import cases
from ..conftest import TEST_SLOT_BYTES
from .test_alltoall import DTYPES, _expected, _inputs, _run, split_matrix

ROOM = TEST_SLOT_BYTES - 64   # a slot's room for the input: the counts take a cache line


def _run_watched(case):
    """``_run``, noting whether the parts were moved off the board (api._move_parts)."""
    from minidist.comm.collectives import api
    moved = []
    move = api._move_parts

    def spy(*args):
        moved.append(1)
        move(*args)
    api._move_parts = spy
    try:
        got, last = _run(case)
    finally:
        api._move_parts = move
    return got, last, bool(moved)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_board_all_to_all_matches_numpy_reference_on_both_sides_of_the_slot(worlds, data):
    n = data.draw(st.sampled_from([2, 3, 4]))
    case = dict(S=data.draw(split_matrix(n)),
                row_shape=tuple(data.draw(st.lists(st.integers(1, 3), max_size=2))),
                dtype=data.draw(st.sampled_from(DTYPES)), seed=data.draw(st.integers(0, 999)))
    row_bytes = np.dtype(case["dtype"]).itemsize * int(np.prod(case["row_shape"]))
    all_fit = all(sum(row) * row_bytes <= ROOM for row in case["S"])
    for rank, (got, last, moved_off) in enumerate(worlds.get(n).run(_run_watched, case)):
        assert np.array_equal(got, _expected(case, rank)), f"rank {rank} of {case}"
        assert moved_off == (not all_fit), f"rank {rank}: all fit = {all_fit}"
        sent = sum(case["S"][rank]) - case["S"][rank][rank]
        assert last["bytes_sent"] == sent * row_bytes


def _splits_disagree():
    import minidist.distributed as dist
    from minidist.backend import xp
    r = dist.get_rank()
    x = xp.ones(4, dtype="float32")
    out = xp.zeros(4, dtype="float32")
    try:
        # rank 1 says it sends 3 rows to rank 0, which expects 2 from it
        dist.all_to_all_single(out, x, [2, 2], [3, 1] if r == 1 else [2, 2])
    except dist.CollectiveMismatchError as e:
        error = str(e)
    else:
        error = None
    y = xp.ones(2, dtype="float32")
    dist.all_to_all_single(y, xp.full(2, float(r), dtype="float32"))   # the world goes on
    return error, y.tolist()


def test_splits_that_disagree_on_the_board_raise_on_every_rank(worlds):
    for rank, (error, later) in enumerate(worlds.get(2).run(_splits_disagree)):
        assert error is not None and "rank 1 sends 3 rows to rank 0, which expects 2" in error
        assert later == [0.0, 1.0]


def _sequence(cases):
    """Run the cases one after another in one world: a split plan made by an
    earlier call serves every later call with the same splits on this rank."""
    return [_run(case)[0] for case in cases]


def _between_all_reduces(cases):
    """``_sequence``, with an all-reduce through the board before each call:
    it writes its array over the counts an all-to-all keeps in its slot."""
    import minidist.distributed as dist
    from minidist import backend
    out = []
    for case in cases:
        x = backend.xp.full(64, dist.get_rank() - 7.0)   # 512 bytes: over the counts
        dist.all_reduce(x)
        out.append(_run(case)[0])
    return out


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_a_repeated_call_after_an_all_reduce_on_its_slot_matches_the_reference(worlds,
                                                                               data):
    n = data.draw(st.sampled_from([2, 3]))
    S, dtype = data.draw(split_matrix(n)), data.draw(st.sampled_from(DTYPES))
    cases = [dict(S=S, row_shape=(3,), dtype=dtype, seed=k) for k in range(4)]
    for rank, got in enumerate(worlds.get(n).run(_between_all_reduces, cases)):
        for i, case in enumerate(cases):
            assert np.array_equal(got[i], _expected(case, rank)), f"rank {rank}, call {i}"


@st.composite
def keeping_my_splits(draw, n):
    """Split matrices that differ only where the last rank neither sends nor
    receives: it makes the same call each time while the others' splits (and so
    the offsets of its parts in their slots, and whether their inputs fit) change."""
    base = draw(split_matrix(n))
    out = []
    for _ in range(draw(st.integers(2, 5))):
        S = [list(row) for row in base]
        for i in range(n - 1):
            for j in range(n - 1):
                S[i][j] = draw(st.sampled_from([0, 1, 3, 600, 2000]))
        out.append(S)
    return out


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_repeated_splits_follow_the_peers_changes_bit_for_bit(worlds, data):
    n = data.draw(st.sampled_from([3, 4]))
    dtype, seed = data.draw(st.sampled_from(DTYPES)), data.draw(st.integers(0, 999))
    matrices = data.draw(keeping_my_splits(n))
    order = data.draw(st.lists(st.sampled_from(range(len(matrices))), min_size=3, max_size=8))
    cases = [dict(S=matrices[k], row_shape=(2,), dtype=dtype, seed=seed + k) for k in order]
    for rank, got in enumerate(worlds.get(n).run(_sequence, cases)):
        for i, case in enumerate(cases):
            assert np.array_equal(got[i], _expected(case, rank)), f"rank {rank}, call {i}"


def test_a_peer_that_never_posts_is_named_within_the_timeout():
    err = cases.named_within_the_timeout("all_to_all_single")
    assert err.rank in (0, 1)
    assert "rank 2 did not enter all_to_all_single" in err.remote_traceback


def _another_call(kind):
    """Rank 1 makes another call (or the same call again, after a first one with
    the same splits): every rank raises, and the world goes on."""
    import minidist.distributed as dist
    from minidist.backend import xp
    r = dist.get_rank()
    x, out = xp.ones(6, dtype="float32"), xp.zeros(6, dtype="float32")
    dist.all_to_all_single(out, x)                     # a split plan made on every rank
    try:
        if r == 1 and kind == "broadcast":
            dist.broadcast(xp.ones(6, dtype="float32"), src=0)
        elif r == 1 and kind == "dtype":
            dist.all_to_all_single(xp.zeros(6), xp.ones(6))   # float64
        else:
            dist.all_to_all_single(out, x)
    except dist.CollectiveMismatchError as e:
        error = str(e)
    else:
        error = None
    y = xp.zeros(3, dtype="float32")
    dist.all_to_all_single(y, xp.full(3, float(r), dtype="float32"))
    return error, y.tolist()


def test_another_call_after_a_kept_plan_is_refused_on_every_rank(worlds):
    for kind in ("broadcast", "dtype"):
        for rank, (error, later) in enumerate(worlds.get(3).run(_another_call, kind)):
            assert error is not None and "differ in" in error, f"{kind}, rank {rank}: {error}"
            assert later == [0.0, 1.0, 2.0]


def test_more_split_plans_than_are_kept_still_match_the_reference(worlds):
    """Splits that change every call (an MoE router's) outgrow the kept split
    plans (MAX_SPLIT_PLANS); the calls after that, and a repeat of the first
    splits, still move the right rows."""
    from minidist.comm.collectives.alltoall_board import MAX_SPLIT_PLANS
    ks = list(range(MAX_SPLIT_PLANS + 4)) + [0, 1]
    cases = [dict(S=[[k, 3], [2, k + 1]], row_shape=(3,), dtype="float32", seed=k) for k in ks]
    for rank, got in enumerate(worlds.get(2).run(_sequence, cases)):
        for i, case in enumerate(cases):
            assert np.array_equal(got[i], _expected(case, rank)), f"rank {rank}, call {i}"


def _kept_plan_against_pairwise(case, calls):
    """``calls`` all-to-alls with the same splits (from the second on, the kept
    split plan's way: one copy in, one concatenate out), on every other row of
    larger arrays (strided input and output), then as many in place (output is
    input) where every rank has as many rows in as out; then the pairwise exchange, the send/recv
    oracle, on a contiguous copy of the same input. ``keep_direct``: the part a
    rank keeps goes from input to output whatever its size."""
    from minidist.comm.collectives import alltoall_board
    saved = alltoall_board.KEEP_DIRECT_BYTES
    if case["keep_direct"]:
        alltoall_board.KEEP_DIRECT_BYTES = 0
    try:
        return _strided_in_place_and_oracle(case, calls)
    finally:
        alltoall_board.KEEP_DIRECT_BYTES = saved


def _strided_in_place_and_oracle(case, calls):
    import minidist.distributed as dist
    from minidist import backend
    from minidist.comm.collectives.alltoall import offsets, pairwise_all_to_all
    from minidist.comm.group import resolve
    r, n = dist.get_rank(), dist.get_world_size()
    S, row_shape, dtype = case["S"], tuple(case["row_shape"]), case["dtype"]
    col = [S[i][r] for i in range(n)]
    x = _inputs(case, r)
    wide_in = backend.xp.zeros((2 * len(x),) + row_shape, dtype=dtype)
    wide_in[::2] = backend.from_host(x)
    wide_out = backend.xp.zeros((2 * sum(col),) + row_shape, dtype=dtype)
    strided, in_place = [], []
    for _ in range(calls):
        wide_out[...] = 0
        dist.all_to_all_single(wide_out[::2], wide_in[::2], col, S[r])
        strided.append(backend.to_host(wide_out).copy())
    if all(sum(S[i]) == sum(S[j][i] for j in range(n)) for i in range(n)):  # rows in = out
        same = backend.xp.zeros(x.shape, dtype=dtype)
        for _ in range(calls):
            same[...] = backend.from_host(x)
            dist.all_to_all_single(same, same, col, S[r])
            in_place.append(backend.to_host(same).copy())
    g = resolve(None)
    row = int(np.prod(row_shape))
    oracle = backend.xp.zeros(sum(col) * row, dtype=dtype)
    pairwise_all_to_all(g, backend.from_host(x.reshape(-1)), offsets(S[r]), oracle, offsets(col),
                        row, g.next_collective_tag())
    return strided, in_place, backend.to_host(oracle).reshape((sum(col),) + row_shape)


@st.composite
def kept_plan_case(draw):
    n = draw(st.sampled_from([2, 3, 4]))
    if draw(st.booleans()):
        k = draw(st.integers(1, 6))
        S = [[k] * n for _ in range(n)]
    else:
        S = [[draw(st.sampled_from([0, 1, 2, 5, 9])) for _ in range(n)] for _ in range(n)]
    return dict(S=S, row_shape=tuple(draw(st.lists(st.integers(1, 3), max_size=2))),
                dtype=draw(st.sampled_from(DTYPES)), seed=draw(st.integers(0, 999)),
                keep_direct=draw(st.booleans()))


@settings(max_examples=6, deadline=None)
@given(case=kept_plan_case())
# in place, the part rank 1 keeps at row 0 of its input and row 2 of its output
@example(case=dict(S=[[1, 2, 0], [0, 1, 2], [2, 0, 1]], row_shape=(), dtype="float32", seed=1,
                   keep_direct=True))
def test_a_kept_plan_on_strided_and_aliased_arrays_equals_the_pairwise_exchange(worlds, case):
    """The latency path of a repeated call (its parts concatenated out of the
    slots into the caller's output, the part a rank keeps through its slot or
    straight from its input) moves exactly what the pairwise exchange moves:
    into every other row of a strided output and no other, and in place, at
    worlds 2-4, uneven splits, every dtype."""
    n = len(case["S"])
    for rank, (strided, in_place, oracle) in enumerate(
            worlds.get(n).run(_kept_plan_against_pairwise, case, 3)):
        assert np.array_equal(oracle, _expected(case, rank)), f"rank {rank}: the oracle, {case}"
        for i, wide in enumerate(strided):
            assert np.array_equal(wide[::2], oracle), f"rank {rank}, call {i} of {case}"
            assert not wide[1::2].any(), f"rank {rank}, call {i}: rows between were written"
        for i, same in enumerate(in_place):
            assert np.array_equal(same, oracle), f"rank {rank}, in-place call {i} of {case}"
