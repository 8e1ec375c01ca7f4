"""async_op=True returns a handle; the collective progresses in the background."""
import numpy as np


def _overlap():
    import time
    import minidist.distributed as dist
    from minidist import backend
    xs = [backend.xp.ones(200_000) * (i + dist.get_rank()) for i in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    a = np.random.default_rng(0).standard_normal((300, 300))
    t = time.perf_counter()
    for _ in range(5):
        a = a @ a / 300.0  # computation while the all-reduces run
    compute_s = time.perf_counter() - t
    for w in works:
        assert w.wait()
    y = backend.xp.ones(5)
    dist.all_reduce(y)  # a synchronous call after async ones keeps the order
    return [float(backend.to_host(x)[0]) for x in xs], float(backend.to_host(y)[0]), compute_s


def test_async_all_reduce_returns_a_handle_and_completes(worlds):
    results = worlds.get(2).run(_overlap)
    for sums, y, _ in results:
        assert sums == [1.0, 3.0, 5.0] and y == 2.0


def _async_error():
    import minidist.distributed as dist
    from minidist.backend import xp
    w = dist.all_reduce(xp.ones(4 + dist.get_rank()), async_op=True)
    try:
        w.wait()
    except dist.CollectiveMismatchError:
        return "raised"
    return "no error"


def test_an_async_error_is_raised_by_wait(worlds):
    assert worlds.get(2).run(_async_error) == ["raised", "raised"]


def test_a_collective_queued_on_an_idle_thread_is_taken_up_before_the_call_returns():
    """The launch (work.py): the first job starts before ``submit`` returns, so its sends
    leave while the caller computes; a second, queued behind it, returns at once."""
    import threading

    from minidist.comm.collectives import work
    gate = threading.Event()
    first = work.submit(lambda: gate.wait(10), async_op=True)
    try:
        assert first.started_at is not None            # taken up already
        second = work.submit(lambda: None, async_op=True)
        assert second.started_at is None and not first.is_completed()   # did not wait
    finally:
        gate.set()
    assert first.wait(10) and second.wait(10)
