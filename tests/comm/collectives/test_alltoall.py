"""all_to_all_single equals the NumPy reference for random worlds 1..8 and random
split matrices (zeros included); a split matrix on which two ranks disagree is a
CollectiveMismatchError on every rank, naming the pair; bytes are counted."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import RankFailedError
from minidist.comm.collectives import cost

DTYPES = ("float16", "float32", "float64", "int32", "uint8")


def _inputs(case, rank):
    """Rank ``rank``'s input: sum(S[rank]) rows of shape row_shape, values tagged by rank."""
    S, row_shape, dtype = case["S"], tuple(case["row_shape"]), case["dtype"]
    rng = np.random.default_rng(case["seed"] * 31 + rank)
    rows = sum(S[rank])
    return np.asarray(rng.integers(0, 100, size=(rows,) + row_shape), dtype=dtype)


def _expected(case, rank):
    """What rank ``rank`` must receive: part ``rank`` of every rank's input, in rank order."""
    S = case["S"]
    parts = []
    for src in range(len(S)):
        x = _inputs(case, src)
        lo = sum(S[src][:rank])
        parts.append(x[lo:lo + S[src][rank]])
    return np.concatenate(parts)


def _run(case):
    import minidist.distributed as dist
    from minidist import backend
    r, n = dist.get_rank(), dist.get_world_size()
    S = case["S"]
    x = backend.from_host(_inputs(case, r))
    col = [S[i][r] for i in range(n)]
    out = backend.xp.zeros((sum(col),) + tuple(case["row_shape"]), dtype=case["dtype"])
    equal = case.get("equal", False)
    dist.all_to_all_single(out, x, None if equal else col, None if equal else S[r])
    return backend.to_host(out).copy(), dist.get_stats().last


@st.composite
def split_matrix(draw, n, equal=False):
    if equal:
        k = draw(st.integers(0, 4))
        return [[k] * n for _ in range(n)]
    return [[draw(st.sampled_from([0, 0, 1, 2, 3, 7, 600])) for _ in range(n)]
            for _ in range(n)]


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_all_to_all_single_matches_numpy_reference(worlds, world_size, data):
    n = world_size
    equal = data.draw(st.booleans())
    case = dict(S=data.draw(split_matrix(n, equal)), equal=equal,
                row_shape=tuple(data.draw(st.lists(st.integers(1, 3), max_size=2))),
                dtype=data.draw(st.sampled_from(DTYPES)), seed=data.draw(st.integers(0, 999)))
    results = worlds.get(n).run(_run, case)
    for rank, (got, last) in enumerate(results):
        want = _expected(case, rank)
        assert got.dtype == want.dtype and np.array_equal(got, want), f"rank {rank} of {case}"
        # bytes counted: what this rank sends to the others, and receives from them
        item = np.dtype(case["dtype"]).itemsize * int(np.prod(case["row_shape"]))
        sent = sum(case["S"][rank]) - case["S"][rank][rank]
        recv = sum(case["S"][i][rank] for i in range(n)) - case["S"][rank][rank]
        assert last["bytes_sent"] == sent * item and last["bytes_recv"] == recv * item


def test_all_to_all_single_equals_all_to_all_of_lists(worlds):
    """The list version and the single-array version move the same parts."""
    def fn():
        import minidist.distributed as dist
        from minidist.backend import xp
        r, n = dist.get_rank(), dist.get_world_size()
        sizes = [(r + j) % 3 for j in range(n)]           # r sends (r + j) % 3 rows to j
        col = [(i + r) % 3 for i in range(n)]
        x = xp.arange(sum(sizes), dtype="float64") + 100 * r
        out = xp.zeros(sum(col))
        dist.all_to_all_single(out, x, col, sizes)
        parts = xp.split(x, [sum(sizes[:j]) for j in range(1, n)])
        outs = [xp.zeros(c) for c in col]
        dist.all_to_all(outs, list(parts))
        return bool((xp.concatenate(outs) == out).all())
    assert all(worlds.get(3).run(fn))


def _disagree():
    import minidist.distributed as dist
    from minidist.backend import xp
    r = dist.get_rank()
    # rank 0 says it sends 2 rows to rank 1; rank 1 expects 3 from rank 0
    send = [1, 2] if r == 0 else [1, 1]
    recv = [1, 1] if r == 0 else [3, 1]
    dist.all_to_all_single(xp.zeros(sum(recv)), xp.zeros(sum(send)), recv, send)


def test_split_sizes_that_disagree_raise_on_every_rank_naming_the_pair(worlds):
    with pytest.raises(RankFailedError) as info:
        worlds.get(2).run(_disagree)
    failures = info.value.failures
    assert set(failures) == {0, 1}
    for _, text in failures.values():
        assert "CollectiveMismatchError" in text
        assert "rank 0 sends 2 rows to rank 1, which expects 3" in text


def _agree_disagree_agree():
    """The same call (dtype, row shape) three times: its plan keeps the table it
    parsed last, which must not hide a disagreement that comes after."""
    import minidist.distributed as dist
    from minidist.comm.errors import CollectiveMismatchError
    from minidist.backend import xp
    r = dist.get_rank()
    seen = [_ok(), _ok()]
    try:
        _disagree()
        seen.append("no error")
    except CollectiveMismatchError as e:
        seen.append("rank 0 sends 2 rows to rank 1, which expects 3" in str(e))
    seen.append(_ok())
    x = xp.arange(3.0) + 10 * r  # S = [[1, 2], [2, 1]]: every rank's row and column alike
    out = xp.zeros(3)
    splits = [1, 2] if r == 0 else [2, 1]
    dist.all_to_all_single(out, x, splits, splits)
    seen.append(out.tolist() == ([0.0, 10.0, 11.0] if r == 0 else [1.0, 2.0, 12.0]))
    return seen


def test_a_disagreement_after_agreeing_calls_still_raises(worlds):
    for seen in worlds.get(2).run(_agree_disagree_agree):
        assert seen == [True, True, True, True, True]


def test_all_to_all_single_against_another_collective_is_a_mismatch(worlds):
    def fn():
        import minidist.distributed as dist
        from minidist.backend import xp
        if dist.get_rank() == 0:
            dist.all_to_all_single(xp.zeros(4), xp.zeros(4))
        else:
            dist.all_reduce(xp.zeros(4))
    with pytest.raises(RankFailedError) as info:
        worlds.get(2).run(fn)
    assert all("CollectiveMismatchError" in text for _, text in info.value.failures.values())
    assert all(worlds.get(2).run(_ok))  # the world is still usable afterwards


def _ok():
    import minidist.distributed as dist
    from minidist.backend import xp
    out = xp.zeros(4)
    dist.all_to_all_single(out, xp.ones(4) * dist.get_rank())
    return bool((out == xp.asarray([0.0, 0.0, 1.0, 1.0])).all())


@pytest.mark.parametrize("bad, message", [
    (dict(input_split_sizes=[1, 1, 1]), "must be 2 non-negative counts"),
    (dict(input_split_sizes=[3, -1]), "must be 2 non-negative counts"),
    (dict(rows=3), "do not split into 2 equal parts"),
    (dict(out_dtype="float32"), "must have the same dtype"),
])
def test_bad_arguments_say_what_is_wrong(worlds, bad, message):
    def fn(bad):
        import minidist.distributed as dist
        from minidist.backend import xp
        rows = bad.get("rows", 2)
        x = xp.zeros(rows)
        out = xp.zeros(rows, dtype=bad.get("out_dtype", "float64"))
        try:
            dist.all_to_all_single(out, x, input_split_sizes=bad.get("input_split_sizes"),
                                   output_split_sizes=None)
        except ValueError as e:
            return str(e)
        return ""
    for text in worlds.get(2).run(fn, bad):
        assert message in text


def test_pairwise_all_to_all_cost_sends_n_minus_1_over_n():
    c = cost.pairwise_all_to_all(8e6, 4, 1e-6, 1e9)
    assert c.bytes_sent == pytest.approx(6e6) and c.steps == 3
    assert c.seconds == pytest.approx(3e-6 + 6e6 / 1e9)
    assert cost.all_to_all_bus_bandwidth(1e6, 2, 1e-3) == pytest.approx((1e9, 5e8))
