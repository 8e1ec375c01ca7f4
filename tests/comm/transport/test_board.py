"""The board's waits (transport/board.py) end as the channels' do: a rank killed while
its peers are in a collective through the board (oneshot.py's all-reduce,
alltoall_board.py's all-to-all) fails the survivors' call naming it, whether they
wait at the claim (for it to acknowledge their last post) or for its post; the
survivors then go on through the board in a group without it (the quorum's case: each
acknowledged what the other posted before giving up); a peer that returned from the
run is named at once too. The group timeout is long (30 s), so a survivor that
raised only at the timeout would fail the test with CommTimeoutError, not the error
asserted; no rank nor segment outlives its world."""
import os
import signal
import time

import pytest

from minidist.comm import PeerDiedError, RankFailedError, World
from minidist.comm.launch import RankLost

from ..conftest import TEST_SLOT_BYTES, alive

WAIT_S = 30.0   # the group timeout: far longer than a death takes to be seen


def _board_call(collective, group=None):
    """A small call through the board on ``group`` (None: the world); its result."""
    import minidist.comm as comm
    from minidist.backend import xp
    from minidist.comm.group import resolve
    g = resolve(group)
    me = comm.get_rank()
    if collective == "all_reduce":
        x = xp.full(3, float(me + 1))
        comm.all_reduce(x, group=group, algorithm="allgather")   # fits the slot: one-shot
        out = x
    else:
        x = xp.arange(g.size, dtype="float64") + 10 * me        # row j goes to rank j
        out = xp.empty(g.size)
        comm.all_to_all_single(out, x, group=group)
    assert g.small_plans, "the call did not take the board"    # only the board keeps plans
    return out.tolist()


def _kill_at(collective, where, victim, outcome):
    """Rank ``victim`` leaves (``outcome``: "dies" by SIGKILL, or "returns" from the
    run) at ``where``: "claim", once the others have finished a call in which it read
    their posts without acknowledging them, so that they wait at their next claim for
    it; "wait", before it posts, so that they wait for its post."""
    import minidist.comm as comm
    from minidist.comm.group import world_group
    pair = comm.new_group([0, 1])              # every rank builds it, as new_group requires
    _board_call(collective)                     # every slot posted and read once
    world = world_group()
    t = world.transport

    def leave(peers=None):
        if where == "claim":                    # the others have finished this call
            number = world.calls
            while not all(r.finished(world.ctx, number)
                          for r in t._flight_records() if r.rank != victim):
                time.sleep(0.001)
        if outcome == "dies":
            os.kill(os.getpid(), signal.SIGKILL)

    if comm.get_rank() == victim:
        if where == "wait":
            leave()
        else:
            t.board.ack = leave                 # reads their posts, never acknowledges
            _board_call(collective)
        return "returned"
    try:
        if where == "claim":
            _board_call(collective)             # had the victim's post: finishes
        _board_call(collective)
        return "finished"
    except PeerDiedError as e:
        caught = e.rank
    return caught, _board_call(collective, pair)   # the survivors go on through the board


def _pids():
    return os.getpid()


@pytest.mark.parametrize("collective", ["all_reduce", "all_to_all"])
@pytest.mark.parametrize("where", ["claim", "wait"])
def test_a_rank_killed_in_a_board_call_fails_the_survivors_naming_it(collective, where):
    with World(3, fault_tolerant=True, timeout=WAIT_S, run_timeout=90.0,
               slot_bytes=TEST_SLOT_BYTES) as world:
        pids = world.run(_pids)
        got = world.run(_kill_at, collective, where, 2, "dies")
        segment = world.segment_name
    pair_result = {"all_reduce": [[3.0] * 3] * 2, "all_to_all": [[0.0, 10.0], [1.0, 11.0]]}
    assert got[2] == RankLost(2, -9)
    assert got[:2] == [(2, r) for r in pair_result[collective]]
    assert not [p for p in pids if alive(p)], "a rank outlived its world"
    assert not os.path.exists(f"/dev/shm/{segment}")


@pytest.mark.parametrize("collective", ["all_reduce", "all_to_all"])
@pytest.mark.parametrize("where", ["claim", "wait"])
def test_a_peer_that_returned_is_named_at_once_on_the_board(collective, where):
    with pytest.raises(RankFailedError) as failure:
        with World(3, timeout=WAIT_S, run_timeout=90.0, slot_bytes=TEST_SLOT_BYTES) as world:
            world.run(_kill_at, collective, where, 2, "returns")
    err = failure.value
    assert err.rank in (0, 1) and err.exc_type == "PeerFinishedError", err.remote_traceback
    assert "rank 2 has returned" in err.remote_traceback
