"""The direct all-reduce (each rank reads its peers' arrays, direct.py) gives,
on every rank, the bits of the naive all-reduce, which folds in the same rank
order: for real-valued floats, where the order of additions shows, over worlds
1-8, several pieces per chunk, every op. It counts 2(N-1)/N M bytes each way
(equal chunks); when one rank cannot read its peers, ``auto`` takes the ring
on every rank and an explicit direct raises naming why; it raises a mismatch
against a rank that called another algorithm. ``auto`` takes it from its world size's
direct_bytes (all_reduce.THRESHOLDS)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World
from minidist.comm.errors import RankFailedError


def _direct_vs_naive(count, dtype, op, seed, piece_bytes):
    import minidist.distributed as dist
    from minidist.backend import from_host, to_host
    from minidist.comm.collectives import direct
    from minidist.comm.group import resolve
    from minidist.comm.transport.reduce_op import ReduceOp
    piece, direct.PIECE_BYTES = direct.PIECE_BYTES, piece_bytes
    try:
        rng = np.random.default_rng(seed * 31 + dist.get_rank())
        x = rng.standard_normal(count).astype(dtype)
        got, want = from_host(x.copy()), from_host(x.copy())
        before = resolve(None).stats.snapshot()
        dist.all_reduce(got, op=ReduceOp[op], algorithm="direct")
        after = resolve(None).stats.snapshot()
        dist.all_reduce(want, op=ReduceOp[op], algorithm="naive")
    finally:
        direct.PIECE_BYTES = piece
    return to_host(got), to_host(want), after[0] - before[0], after[1] - before[1]  # bytes


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_direct_all_reduce_has_the_bits_of_the_naive_one_on_every_rank(worlds, world_size,
                                                                         data):
    n = world_size
    count = data.draw(st.integers(0, 300))
    dtype = data.draw(st.sampled_from(["float32", "float64"]))
    op = data.draw(st.sampled_from(["SUM", "AVG", "MAX", "MIN", "PROD"]))
    piece_bytes = data.draw(st.sampled_from([8, 40, 1 << 20]))   # several pieces, or one
    results = worlds.get(n).run(_direct_vs_naive, count, dtype, op,
                                data.draw(st.integers(0, 999)), piece_bytes)
    item = np.dtype(dtype).itemsize
    for rank, (got, want, sent, recv) in enumerate(results):
        assert got.tobytes() == want.tobytes(), f"rank {rank}: {count} {dtype} {op}"
        assert got.tobytes() == results[0][0].tobytes()
        if n > 1:  # phase 1: the others' chunks of ours; phase 2: our chunk, N-1 times
            chunk = (rank + 1) * count // n - rank * count // n
            assert sent == recv == ((count - chunk) + (n - 1) * chunk) * item


DIRECT_HERE = 1 << 17   # bytes: these tests set auto to take direct from this size


def _one_rank_cannot_read():
    """Rank 1's reads fail (as where the kernel forbids them): every rank must
    learn it at the first call, take the ring under auto and stop trying, and
    an explicit direct must then raise on every rank, naming why."""
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives import all_reduce
    from minidist.comm.group import resolve
    from minidist.comm.transport import cma
    read, table = cma.read, dict(all_reduce.THRESHOLDS)
    all_reduce.THRESHOLDS[2] = all_reduce.Thresholds(0, 0, DIRECT_HERE)  # auto: direct from it
    if dist.get_rank() == 1:
        cma.read = lambda pid, address, out: False
    calls = []
    planned = all_reduce.PLANNED["direct"]

    def spy(*args):
        calls.append(planned[1](*args))
    all_reduce.PLANNED["direct"] = (planned[0], spy)
    try:
        out = []
        for _ in range(2):
            x = xp.arange(DIRECT_HERE // 8, dtype="float64") * (dist.get_rank() + 1)
            dist.all_reduce(x)                                 # auto: direct by size
            out.append(x[:6].tolist())
            algorithm = dist.get_stats().last["algorithm"]
        try:
            dist.all_reduce(xp.ones(6), algorithm="direct")
            why = None
        except ValueError as e:
            why = str(e)
        return out, calls, resolve(None).direct_reads, algorithm, why
    finally:
        cma.read, all_reduce.PLANNED["direct"] = read, planned
        all_reduce.THRESHOLDS.update(table)


def test_a_rank_that_cannot_read_makes_every_rank_take_the_ring():
    with World(3, timeout=20.0, run_timeout=60.0) as w:
        for out, calls, direct_reads, algorithm, why in w.run(_one_rank_cannot_read):
            assert out == [(np.arange(6.0) * 6).tolist()] * 2
            assert calls == [] and direct_reads is False and algorithm == "ring"
            assert why is not None and "could not read its peers' memory" in why


def test_direct_against_another_algorithm_is_a_mismatch(worlds):
    def fn():
        import minidist.distributed as dist
        from minidist.backend import xp
        x = xp.ones(8)
        dist.all_reduce(x, algorithm="direct" if dist.get_rank() == 0 else "ring")
    with pytest.raises(RankFailedError) as info:
        worlds.get(2).run(fn)
    assert all("CollectiveMismatchError" in text for _, text in info.value.failures.values())


def test_direct_over_an_emulated_link_and_without_the_check():
    """Over a link the reader waits out the wire (link.py); without the check
    (which carries the addresses) auto takes the ring and an explicit direct
    raises, naming why: the same sums either way."""
    def fn(check):
        import minidist.distributed as dist
        from minidist.backend import xp
        from minidist.comm.collectives import all_reduce
        from minidist.comm.group import new_group
        g = new_group([0, 1])
        g.check = check  # as in init_process_group(check=False)
        all_reduce.THRESHOLDS[2] = all_reduce.Thresholds(0, 0, DIRECT_HERE)  # auto: direct
        count = 5000 if check else DIRECT_HERE // 8
        x = xp.arange(float(count)) + dist.get_rank()
        dist.all_reduce(x, algorithm="direct" if check else "auto", group=g)
        same = x.tolist() == (2 * np.arange(float(count)) + 1).tolist()
        if check:
            return same
        try:
            dist.all_reduce(x, algorithm="direct", group=g)
        except ValueError as e:
            return same and "check=False" in str(e) and g.stats.last["algorithm"] == "ring"
        return False
    with World(2, timeout=20.0, run_timeout=60.0, link_gbps=1.0) as w:
        assert all(w.run(fn, True)) and all(w.run(fn, False))


def test_auto_takes_direct_from_direct_bytes_and_the_ring_below(monkeypatch):
    from minidist.comm.collectives import all_reduce
    from minidist.comm.collectives.all_reduce import Thresholds, choose
    monkeypatch.setitem(all_reduce.THRESHOLDS, 2, Thresholds(4096, 1 << 16, 1 << 20))
    monkeypatch.setitem(all_reduce.THRESHOLDS, 4, Thresholds(1024, 1 << 14, 1 << 62))
    assert choose("auto", 4096, 2) == "allgather"
    assert choose("auto", 4096 + 4, 2) == "recursive_doubling"
    assert choose("auto", (1 << 16) - 4, 2) == "recursive_doubling"
    assert choose("auto", 1 << 16, 2) == "ring"
    assert choose("auto", (1 << 20) - 4, 3) == "ring"         # world 3: world 2's entry
    assert choose("auto", 1 << 20, 3) == "direct"
    assert choose("auto", 1 << 30, 4) == "ring"               # world 4: its own, no direct
    assert choose("auto", 1 << 30, 8) == "ring"
    assert choose("auto", 1024 // 3, 4) == "allgather"        # (N-1) * M <= gather_bytes
    assert choose("ring", 1 << 30, 2) == "ring"               # a named algorithm is kept
    with pytest.raises(ValueError, match="unknown all_reduce algorithm"):
        choose("fastest", 8, 2)
