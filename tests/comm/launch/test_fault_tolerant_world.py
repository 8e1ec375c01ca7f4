"""A world that goes on when a rank dies: the survivors' waits in a collective of the dead
rank fail at once naming it (also where they wait on a live rank, as in a ring), a group
without it goes on, and a rank that raises still stops the world."""
import os
import signal

import pytest

from minidist.comm import PeerDiedError, RankFailedError, World
from minidist.comm.launch import RankLost


def _die_or_all_reduce(victim):
    import minidist.comm as comm
    from minidist.backend import xp
    pair = comm.new_group([0, 1])           # every rank builds it, as new_group requires
    if comm.get_rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    x = xp.ones(3000)
    try:
        comm.all_reduce(x, algorithm="ring")  # rank 0 and 1 wait on each other as well
        return "finished"
    except PeerDiedError as e:
        caught = e.rank
    if comm.get_rank() in (0, 1):            # a group without the dead rank goes on
        y = xp.ones(3)
        comm.all_reduce(y, group=pair)
        return caught, float(y.sum())
    return caught


@pytest.mark.parametrize("world_size", [3, 4])
def test_a_collective_of_a_dead_rank_fails_on_every_survivor_naming_it(world_size):
    victim = world_size - 1
    with World(world_size, fault_tolerant=True, timeout=30.0, run_timeout=60.0) as world:
        got = world.run(_die_or_all_reduce, victim)
        segment = world.segment_name
    assert got[victim] == RankLost(victim, -9)
    assert got[:2] == [(victim, 6.0), (victim, 6.0)]
    assert got[2:victim] == [victim] * (world_size - 3)
    assert not os.path.exists(f"/dev/shm/{segment}")


def _raise_on_rank_1():
    import minidist.comm as comm
    if comm.get_rank() == 1:
        raise ValueError("a bug, not a lost machine")
    from minidist.backend import xp
    comm.all_reduce(xp.ones(4))


def test_a_rank_that_raises_still_stops_a_fault_tolerant_world():
    with pytest.raises(RankFailedError) as failure:
        with World(3, fault_tolerant=True, timeout=30.0, run_timeout=60.0) as world:
            world.run(_raise_on_rank_1)
    assert failure.value.rank == 1 and failure.value.exc_type == "ValueError"


def _spin_forever():
    """Waits that never count as long (no look at the clock's spin_s, no doorbell sleep):
    a death must end them all the same."""
    from minidist.comm.group import world_group
    world_group().transport.spin_s = 1e9


def _die_then_collectives(victim, n, algorithm, calls):
    import minidist.comm as comm
    from minidist.backend import xp
    comm.all_reduce(xp.ones(n), algorithm=algorithm)   # every post on the board read
    _spin_forever()
    if comm.get_rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    caught = []
    for _ in range(calls):   # a second begins after the death was seen and marked
        try:
            comm.all_reduce(xp.ones(n), algorithm=algorithm)
            caught.append("finished")
        except PeerDiedError as e:
            caught.append(e.rank)
    return caught


# allgather of 3: through the board, where one call only: the next would wait first for
# the dead rank to acknowledge this one's post (a wait that no death ends yet)
@pytest.mark.parametrize("n, algorithm, calls", [(3000, "ring", 2), (3, "allgather", 1)])
def test_a_death_ends_a_spinning_wait_and_fails_a_later_collective_of_the_dead_rank(
        n, algorithm, calls):
    # a survivor checks the deaths the launcher marks at every empty pass of its wait
    # (the channels' or the board's), not only once the wait has spun spin_s, and a call
    # that begins after a death checks its ranks at its first pass (without, both would
    # spin until run_timeout)
    with World(3, fault_tolerant=True, timeout=30.0, run_timeout=60.0) as world:
        got = world.run(_die_then_collectives, 2, n, algorithm, calls)
        segment = world.segment_name
    assert got == [[2] * calls, [2] * calls, RankLost(2, -9)]
    assert not os.path.exists(f"/dev/shm/{segment}")


def _spare_waits_for_news(victim):
    import minidist.comm as comm
    from minidist.comm.group import world_group
    t = world_group().transport
    comm.barrier()
    if comm.get_rank() == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    if comm.get_rank() != 1:
        return None
    while True:              # as a spare does: mark, look, sleep until news
        mark = t.news_mark()
        failed = t.failed_ranks()
        if failed:
            return failed
        t.wait_news(mark, 1e6)


def test_a_rank_waiting_for_news_wakes_when_the_launcher_marks_a_death():
    with World(3, fault_tolerant=True, timeout=30.0, run_timeout=60.0) as world:
        got = world.run(_spare_waits_for_news, 0)
        noticed = world.noticed
    assert got == [RankLost(0, -9), [0], None]
    assert list(noticed) == [0]


def _on_sendrecv(number, action):
    """From now on, run ``action()`` before this rank's ``number``-th sendrecv (ring steps)."""
    from minidist.comm.group import ProcessGroup
    sendrecv, calls = ProcessGroup.sendrecv, []

    def wrapped(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == number:
            action()
        return sendrecv(self, *args, **kwargs)
    ProcessGroup.sendrecv = wrapped


def _die_on_entering(group):
    """From now on this rank dies (SIGKILL) as it enters a collective of ``group``."""
    transport = group.transport
    begin = transport.record_begin

    def dying(ctx, *args):
        begin(ctx, *args)
        if ctx == group.ctx:
            os.kill(os.getpid(), signal.SIGKILL)
    transport.record_begin = dying


def _finish_then_die_elsewhere():
    # ring 0 -> 1 -> 2 -> 0 over 3 ranks: 4 steps. Rank 1 finishes the all-reduce (its
    # last piece comes from rank 0) and dies as it enters the next collective, of
    # another group; rank 0 still waits for its last piece, which rank 2 sends late
    import time
    import minidist.comm as comm
    from minidist.backend import xp
    rank, pair = comm.get_rank(), comm.new_group([1, 2])
    if rank == 2:
        _on_sendrecv(4, lambda: time.sleep(0.5))
    if rank == 1:
        _die_on_entering(pair)
    x = xp.ones(3000)
    try:
        comm.all_reduce(x, algorithm="ring")
    except PeerDiedError as e:
        return f"rank {e.rank} died"
    if rank == 1:
        comm.all_reduce(xp.ones(30), group=pair, algorithm="ring")
    return float(x.min()), float(x.max())


def test_a_rank_that_died_in_another_group_after_finishing_the_call_does_not_fail_it():
    # the dead rank's record is in another group's call, but its last finished collective
    # is the one rank 0 is in: it sent all it was to send, and rank 0 finishes
    with World(3, fault_tolerant=True, timeout=30.0, run_timeout=60.0) as world:
        got = world.run(_finish_then_die_elsewhere)
    assert got == [(3.0, 3.0), RankLost(1, -9), (3.0, 3.0)]
