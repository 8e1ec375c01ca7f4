"""all_to_all_single's single-copy way (each rank reads its parts straight from
its peers' inputs) equals the NumPy reference for random worlds and split
matrices, counts the same bytes, and when a read fails on one rank every rank
redoes the call with the pairwise exchange and stops offering that way."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend

from .test_alltoall import DTYPES, _expected, _run, split_matrix


def _run_forced(case):
    """``_run`` with the single-copy way taken at any size; returns also which
    way ran (the pairwise exchange is replaced by a spy)."""
    from minidist.comm.collectives import alltoall, api
    calls = []
    pairwise, smallest = api.pairwise_all_to_all, alltoall.SINGLE_COPY_MIN_BYTES

    def spy(*args):
        calls.append(1)
        pairwise(*args)
    api.pairwise_all_to_all, alltoall.SINGLE_COPY_MIN_BYTES = spy, 0
    try:
        got, last = _run(case)
    finally:
        api.pairwise_all_to_all, alltoall.SINGLE_COPY_MIN_BYTES = pairwise, smallest
    return got, last, bool(calls)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_single_copy_matches_numpy_reference(worlds, world_size, data):
    n = world_size
    case = dict(S=data.draw(split_matrix(n)),
                row_shape=tuple(data.draw(st.lists(st.integers(1, 3), max_size=2))),
                dtype=data.draw(st.sampled_from(DTYPES)), seed=data.draw(st.integers(0, 999)))
    results = worlds.get(n).run(_run_forced, case)
    item = np.dtype(case["dtype"]).itemsize * int(np.prod(case["row_shape"]))
    for rank, (got, last, used_pairwise) in enumerate(results):
        assert np.array_equal(got, _expected(case, rank)), f"rank {rank} of {case}"
        # a peer reads host memory only: device arrays always take the pairwise exchange
        assert used_pairwise == (n == 1 or backend.get_backend() == "cupy")
        sent = sum(case["S"][rank]) - case["S"][rank][rank]
        recv = sum(case["S"][i][rank] for i in range(n)) - case["S"][rank][rank]
        assert last["bytes_sent"] == sent * item and last["bytes_recv"] == recv * item


def _one_read_fails(case):
    """Rank 1's reads fail (as where the kernel forbids them): the result must
    still be right, by the pairwise exchange, now and in the next call."""
    from minidist.comm.collectives import alltoall
    from minidist.comm.transport import cma
    import minidist.distributed as dist
    read = cma.read
    if dist.get_rank() == 1:
        cma.read = lambda pid, address, out: False
    try:
        first = _run_forced(case)
        offered = alltoall._offered["single_copy"]
        second = _run_forced(case)
    finally:
        cma.read, alltoall._offered["single_copy"] = read, True
    return first, second, offered


def test_a_failed_read_falls_back_to_the_pairwise_exchange_on_every_rank(worlds):
    case = dict(S=[[2, 3, 0], [1, 0, 4], [600, 2, 1]], row_shape=(3,), dtype="float32",
                seed=7)
    for rank, (first, second, offered) in enumerate(worlds.get(3).run(_one_read_fails, case)):
        for got, _, used_pairwise in (first, second):
            assert np.array_equal(got, _expected(case, rank)) and used_pairwise
        assert offered == (rank != 1)  # the rank whose read failed offers it no more


def test_overlapping_input_and_output_take_the_pairwise_exchange(worlds):
    def fn():
        import minidist.distributed as dist
        from minidist.backend import xp
        from minidist.comm.collectives import alltoall
        from minidist.comm.group import resolve
        buf = xp.arange(8, dtype="float64")
        return alltoall.source_of(resolve(None), buf[:4], buf[2:6]), \
            alltoall.source_of(resolve(None), buf[:4], buf[4:])
    for overlapping, apart in worlds.get(2).run(fn):
        assert overlapping == (0, 0) and apart[0] > 0
