"""Every rank counts the bytes it sends; the counts match the textbook formulas."""
import pytest

M_ELEMS = 1 << 14  # 64 KiB of float32


def _bytes_sent(algorithm):
    import minidist.distributed as dist
    from minidist.backend import xp
    dist.all_reduce(xp.ones(M_ELEMS, dtype="float32"), algorithm=algorithm)
    return dist.get_stats().last


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_all_reduce_sends_2_n_minus_1_over_n_times_m(worlds, n):
    m = 4 * M_ELEMS
    for last in worlds.get(n).run(_bytes_sent, "ring"):
        expect = 2 * (n - 1) / n * m
        assert abs(last["bytes_sent"] - expect) <= 2 * (n - 1) * 4  # one element per step
        assert abs(last["bytes_recv"] - expect) <= 2 * (n - 1) * 4
        assert last["msgs_sent"] == 2 * (n - 1)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_naive_all_reduce_sends_n_minus_1_times_m_at_the_root(worlds, n):
    m = 4 * M_ELEMS
    lasts = worlds.get(n).run(_bytes_sent, "naive")
    assert lasts[0]["bytes_sent"] == (n - 1) * m and lasts[0]["bytes_recv"] == (n - 1) * m
    assert all(last["bytes_sent"] == m for last in lasts[1:])


def _small_bytes(n_elems):
    import minidist.distributed as dist
    from minidist.backend import xp
    dist.all_reduce(xp.ones(n_elems, dtype="float32"))  # auto: allgather
    return dist.get_stats().last


@pytest.mark.parametrize("n", [4, 3, 2])  # from the size the test above ends with
def test_small_all_reduce_sends_n_minus_1_times_m_and_its_check_is_free(worlds, n):
    """The records that carry the same-call check ride along uncounted, as the
    separate check's messages are: what counts is the (N-1) * M of data."""
    for last in worlds.get(n).run(_small_bytes, 256):    # 1 KiB: through the board
        assert last["algorithm"] == "allgather"
        assert last["bytes_sent"] == last["bytes_recv"] == (n - 1) * 1024
        assert last["msgs_sent"] == n - 1        # one post, read by each of N-1 peers
    for last in worlds.get(n).run(_small_bytes, 2048):   # 8 KiB: over the board's 4 KiB
        assert last["algorithm"] == "allgather"
        assert last["bytes_sent"] == last["bytes_recv"] == (n - 1) * 8192
        assert last["msgs_sent"] == (n - 1).bit_length()  # ceil(log2 N) rounds


def test_the_same_call_check_is_not_counted(worlds):
    lasts = worlds.get(2).run(_bytes_sent, "ring")
    assert lasts[0]["bytes_sent"] == 4 * M_ELEMS  # 2(N-1)/N * M with N = 2
