"""Failures are loud and fast, and nothing outlives a world.

Each test starts its own world (a failed world is torn down), makes a rank
fail in some way, and checks: the right error reaches the parent, naming the
rank (and carrying its traceback); no process of the world is still alive;
its shared-memory segment is gone from /dev/shm.

How fast: a failure is reported through the abort flag in about a second
(GRACE_S), where waiting for the others to time out would take their 30 s
timeout. The test tells the two apart with a bound of 20 s, far from both, so
that a busy machine cannot fail it; how fast it really is, is measured by hand
("under 1.5 s under load"), not asserted.
"""
import os
import time

import numpy as np
import pytest

import minidist
from minidist.comm import RankFailedError, World
from minidist.comm.transport import shm

from ..conftest import alive, my_segments

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

LIMIT_S = 20.0  # well under the worlds' 30 s timeout: the abort, not a timeout


def _fail_and_check(world, fn, *args):
    pids, segment = [p.pid for p in world._procs], world.segment_name
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        world.run(fn, *args)
    elapsed = time.monotonic() - start
    assert elapsed < LIMIT_S, f"took {elapsed:.1f} s to report the failure"
    assert not [p for p in pids if alive(p)], "a rank outlived its world"
    assert segment not in shm.leftover_segments()
    return info.value


def test_launch_returns_every_ranks_result():
    def fn(base):
        import minidist.distributed as dist
        return base + dist.get_rank() * 10 + dist.get_world_size()
    before = set(my_segments())
    assert minidist.launch(fn, 3, 1) == [4, 14, 24]
    assert set(my_segments()) == before


def _raise_at_random_point(seed):
    import minidist.distributed as dist
    from minidist.backend import xp
    rng = np.random.default_rng(seed)
    culprit, when = int(rng.integers(4)), int(rng.integers(20))
    x = xp.ones(1000)
    for step in range(20):
        if dist.get_rank() == culprit and step == when:
            raise ValueError(f"rank {culprit} fails at step {step}")
        dist.all_reduce(x, algorithm="ring")
    return culprit


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_raising_at_a_random_point_stops_the_world(seed):
    culprit = int(np.random.default_rng(seed).integers(4))
    with World(4, timeout=30.0, slot_bytes=4096) as world:
        err = _fail_and_check(world, _raise_at_random_point, seed)
    assert err.rank == culprit and err.exc_type == "ValueError"
    assert f"rank {culprit} fails at step" in err.remote_traceback
    assert "Traceback" in err.remote_traceback


def _exit_abruptly():
    import minidist.distributed as dist
    from minidist.backend import xp
    if dist.get_rank() == 2:
        os._exit(3)
    dist.all_reduce(xp.ones(10))


def test_a_rank_exiting_stops_the_world():
    with World(3, timeout=30.0) as world:
        err = _fail_and_check(world, _exit_abruptly)
    assert err.rank == 2 and "exited with code 3" in err.remote_traceback


def _start_a_world():
    with World(2):
        pass


def test_a_rank_starting_a_world_of_its_own_is_told_why_in_one_line():
    """Not multiprocessing's 'daemonic processes are not allowed to have children'."""
    with World(2, timeout=30.0) as world:
        err = _fail_and_check(world, _start_a_world)
    assert err.exc_type == "NestedWorldError", err.remote_traceback
    last = err.remote_traceback.strip().splitlines()[-1]
    assert "cannot start a world of its own" in last and "minidist run" in last
    assert "daemonic" not in err.remote_traceback


def _missing_send(returns: bool):
    import time

    import minidist.distributed as dist
    from minidist.backend import xp
    if dist.get_rank() == 0:
        dist.recv(xp.zeros(3), src=1, tag=7)  # rank 1 never sends
    elif not returns:
        time.sleep(30)                        # ... busy elsewhere, until stopped


def test_a_missing_send_times_out_naming_peer_and_tag():
    with World(2, timeout=1.0) as world:
        err = _fail_and_check(world, _missing_send, False)
    assert err.rank == 0 and err.exc_type == "CommTimeoutError"
    assert "recv from rank 1 (tag 7" in err.remote_traceback


def test_a_rank_that_returned_early_is_named_at_once_by_the_peer_waiting_on_it():
    """Rank 1 returns without sending: rank 0 fails as soon as its wait turns long,
    naming rank 1 (not after its 60 s timeout, blaming itself)."""
    with World(2, timeout=60.0, run_timeout=30.0) as world:
        err = _fail_and_check(world, _missing_send, True)
    assert err.rank == 0 and err.exc_type == "PeerFinishedError", err
    assert "recv from rank 1 (tag 7" in err.remote_traceback
    assert "rank 1 has returned from the function this world runs" in err.remote_traceback


def _send_and_return():
    import time

    import minidist.distributed as dist
    from minidist.backend import xp
    big = xp.arange(1 << 21, dtype="float64")    # 16 MiB: more than its channel holds at once
    if dist.get_rank() == 0:
        dist.isend(big, dst=1, tag=3)            # never waited: still queued as rank 0 returns
        return None
    time.sleep(0.5)                              # rank 0 has returned by now
    out = xp.zeros_like(big)
    dist.recv(out, src=0, tag=3)
    return float(out[-1])


def test_a_rank_returns_only_once_its_queued_sends_are_written():
    """A send left queued (its channel full) is written out before the rank counts its
    run finished, so the peer receives it instead of failing on a finished rank."""
    with World(2, timeout=20.0, run_timeout=60.0) as world:
        assert world.run(_send_and_return) == [None, float((1 << 21) - 1)]


def _shape_mismatch():
    import minidist.distributed as dist
    from minidist.backend import xp
    n = 5 if dist.get_rank() == 1 else 4
    dist.all_reduce(xp.ones((3, n)))


def test_a_shape_mismatch_is_an_error_on_every_rank():
    with World(4, timeout=30.0) as world:
        err = _fail_and_check(world, _shape_mismatch)
    assert set(err.failures) == {0, 1, 2, 3}
    assert {t for t, _ in err.failures.values()} == {"CollectiveMismatchError"}
    assert "(they differ in shape)" in err.remote_traceback
    assert "rank 1: all_reduce op=SUM algorithm=allgather dtype=float64 shape=(3,5)" \
        in err.remote_traceback


def _different_collectives():
    import minidist.distributed as dist
    from minidist.backend import xp
    if dist.get_rank() == 0:
        dist.broadcast(xp.ones(4), src=0)
    else:
        dist.reduce(xp.ones(4), dst=0)


def test_different_collectives_are_an_error_on_every_rank():
    with World(3, timeout=30.0) as world:
        err = _fail_and_check(world, _different_collectives)
    assert {t for t, _ in err.failures.values()} == {"CollectiveMismatchError"}
    assert "differ in collective" in err.remote_traceback


def _rss_growth(n_calls, seed):
    import minidist.distributed as dist
    from minidist import backend
    rng = np.random.default_rng(seed)  # same sizes on every rank

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def burst(k):
        for _ in range(k):
            n = int(rng.integers(0, 20000))
            x = backend.from_host(np.ones(n, dtype=np.float32))
            alg = ["ring", "tree", "naive", "recursive_doubling", "allgather"][int(rng.integers(5))]
            dist.all_reduce(x, algorithm=alg)
    burst(200)  # warm up: allocator pools, caches
    before = rss()
    burst(n_calls)
    return rss() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_a_thousand_collectives_do_not_grow_memory(worlds):
    growth = worlds.get(2, slot_bytes=1 << 16).run(_rss_growth, 1000, 0)
    assert max(growth) < 4 * 2**20, f"resident memory grew by {growth} bytes"


def test_no_segment_is_left_after_a_clean_world():
    with World(2) as world:
        name = world.segment_name
        assert name in shm.leftover_segments()
        world.run(lambda: None)
    assert name not in shm.leftover_segments()


def test_ranks_and_segment_go_when_the_parent_is_killed(tmp_path):
    """Even a parent killed with SIGKILL leaves nothing: the ranks notice and clean up."""
    import signal
    import subprocess
    import sys
    script = tmp_path / "parent.py"
    script.write_text(
        "import time\n"
        "from minidist.comm import World\n"
        "if __name__ == '__main__':\n"
        "    w = World(2)\n"
        "    print(w.segment_name, *[p.pid for p in w._procs], flush=True)\n"
        "    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    segment, *pids = proc.stdout.readline().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline and (any(alive(int(p)) for p in pids)
                                           or segment in shm.leftover_segments()):
        time.sleep(0.1)
    assert not [p for p in pids if alive(int(p))], "a rank outlived its killed parent"
    assert segment not in shm.leftover_segments()


def _blas_threads():
    return os.environ.get("OMP_NUM_THREADS"), os.environ.get("OPENBLAS_NUM_THREADS")


def test_ranks_get_a_share_of_the_cores_for_blas_unless_the_user_chose(monkeypatch):
    from minidist.comm.transport.wait import cores_available
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    n = 3
    share = str(max(1, cores_available() // n))
    assert minidist.launch(_blas_threads, n) == [(share, share)] * n
    assert "OMP_NUM_THREADS" not in os.environ  # the parent's environment is restored
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert minidist.launch(_blas_threads, 2) == [("7", str(max(1, cores_available() // 2)))] * 2


def _backend_name():
    from minidist import backend
    return backend.get_backend()


def test_ranks_use_the_backend_chosen_with_set_backend_not_only_the_environment():
    from minidist import backend
    before = backend.get_backend()
    other = "numpy" if before == "guard" else "guard"  # not what MINIDIST_BACKEND says
    backend.set_backend(other)
    try:
        assert minidist.launch(_backend_name, 2) == [other, other]
    finally:
        backend.set_backend(before)



def _launched():
    import minidist.distributed as dist
    return dist.launched()


def test_a_rank_knows_it_was_launched_and_a_plain_process_does_not(monkeypatch):
    import minidist.distributed as dist
    for var in ("MINIDIST_SHM", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert not dist.launched()
    assert minidist.launch(_launched, 2) == [True, True]


def _rank_2_stops_calling():
    import minidist.distributed as dist
    from minidist.backend import xp
    x = xp.ones(1000)
    dist.all_reduce(x, algorithm="ring")
    if dist.get_rank() == 2:
        time.sleep(30)  # computing, as far as the others can tell
    dist.all_reduce(x, algorithm="ring")


def test_a_hang_names_the_rank_not_in_the_collective_and_every_ranks_last_call():
    with World(4, timeout=1.0) as world:
        err = _fail_and_check(world, _rank_2_stops_calling)
    assert err.exc_type == "CommTimeoutError" and err.rank != 2
    text = err.remote_traceback
    assert "rank 2 did not enter all_reduce #2 of group [0, 1, 2, 3]" in text
    assert "rank 2: all_reduce #1 of group [0, 1, 2, 3] op=SUM algorithm=ring" in text
    assert "finished" in text and "in it for" in text
    assert set(err.failures) == {0, 1, 2, 3}      # every rank is listed, rank 2 as stopped
    assert err.failures[2][0] == "Stopped"


def _ring_waits_on_the_wrong_neighbour():
    """Every rank sends to r+1 but waits for r+2: a ring of isend / irecv().wait() that hangs."""
    import minidist.distributed as dist
    from minidist.backend import xp
    r, n = dist.get_rank(), dist.get_world_size()
    x = xp.ones(4)
    h = dist.isend(x, (r + 1) % n)
    dist.irecv(xp.empty(4), (r + 2) % n).wait()
    h.wait()


def test_a_hang_in_a_handles_wait_is_in_the_flight_record():
    """irecv(...).wait() is noted like a blocking recv: the table says which peer each rank waits for."""
    with World(4, timeout=1.0) as world:
        err = _fail_and_check(world, _ring_waits_on_the_wrong_neighbour)
    assert err.exc_type == "CommTimeoutError"
    for r in range(4):
        assert f"rank {r}: recv of group [0, 1, 2, 3] from rank {(r + 2) % 4}" in err.remote_traceback
    assert "no call yet" not in err.remote_traceback


def _rank_1_sleeps():
    import minidist.distributed as dist
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(30)
    dist.barrier()


def test_a_run_timeout_blames_no_rank_and_says_what_each_was_doing():
    from minidist.comm import WorldTimeoutError
    world = World(3, timeout=30.0, run_timeout=1.5)
    pids, segment = [p.pid for p in world._procs], world.segment_name
    with pytest.raises(WorldTimeoutError) as info:
        world.run(_rank_1_sleeps)
    err = info.value
    assert err.running == [0, 1, 2]
    assert "rank 1 did not enter barrier #2 of group [0, 1, 2], which ranks 0, 2 wait in" \
        in err.report
    assert "rank 1: barrier #1 of group [0, 1, 2]: finished" in err.report
    assert not [p for p in pids if alive(p)] and segment not in shm.leftover_segments()


def _start_a_process():
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid


def test_a_process_a_rank_started_ends_with_the_world():
    """Each rank leads its own process group, which closing the world kills: a
    subprocess still running when its rank returned is not left orphaned."""
    with World(2, timeout=30.0, run_timeout=60.0) as world:
        started = world.run(_start_a_process)
        assert all(alive(pid) for pid in started)
    deadline = time.monotonic() + 10.0              # (SIGKILL lands when it is scheduled)
    while [pid for pid in started if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in started if alive(pid)], "a rank's subprocess outlived its world"


JOIN_AGAIN = """
import minidist.distributed as dist
try:
    dist.init_process_group(timeout=5.0)
except Exception as e:
    print(type(e).__name__, e)
else:
    print("joined as rank", dist.get_rank())
"""


def _child_joins_the_world():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", JOIN_AGAIN], capture_output=True, text=True,
                          timeout=120)                # the rank's environment, inherited
    return done.stdout + done.stderr


def test_a_child_inheriting_a_ranks_environment_cannot_join_as_that_rank():
    with World(2, timeout=30.0, run_timeout=90.0) as world:
        said = world.run(_child_joins_the_world)
    for rank, text in enumerate(said):
        assert "NotThisRankError" in text and "joined" not in text, text
        assert f"as rank {rank}: rank {rank} is process" in text, text


def _two_children_join_the_world():
    return [_child_joins_the_world() for _ in range(2)]


def test_a_refused_child_leaves_the_worlds_segment_in_place():
    """A refused child exits; its resource tracker must not unlink the world's segment
    on the way out, or the next process to open it (a peer's child, or a rank) finds
    none: the second child of each rank is refused for the same reason as the first."""
    with World(2, timeout=30.0, run_timeout=120.0) as world:
        said = world.run(_two_children_join_the_world)
        for rank, texts in enumerate(said):
            for text in texts:
                assert "NotThisRankError" in text and f"as rank {rank}:" in text, text
