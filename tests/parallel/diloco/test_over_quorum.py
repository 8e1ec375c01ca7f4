"""DiLoCo over a fault-tolerance Manager: a replica killed between two synchronisations
or inside the outer all-reduce costs only its own outer gradient. The survivors equal
Algorithm 1 in one process whose mean at each synchronisation is over the replicas
still alive then; nothing hangs, nothing is left behind; bad combinations are refused."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World
from minidist.comm.launch import RankLost

from parallel.diloco.diloco_cases import case_of, simulate, train_over_quorum


def kill_step_of(data, H, steps, phase):
    """A 0-based inner step: any for "inner"; one after which a sync runs for "outer"."""
    if phase == "inner":
        return data.draw(st.integers(0, steps - 1), label="kill step")
    syncs = [s for s in range(steps) if (s + 1) % H == 0]
    return data.draw(st.sampled_from(syncs), label="kill step (a sync)")


@settings(max_examples=4, deadline=None)
@given(data=st.data(), world=st.sampled_from([3, 4]), H=st.integers(1, 3),
       phase=st.sampled_from(["inner", "outer"]), seed=st.integers(0, 2**16))
def test_survivors_equal_algorithm_1_over_the_replicas_alive_at_each_sync(
        data, world, H, phase, seed):
    steps = 3 * H + 1
    step = kill_step_of(data, H, steps, phase)
    victim = data.draw(st.integers(0, world - 1), label="victim")
    case = case_of(world=world, seed=seed, H=H, steps=steps, kill=(victim, step, phase))
    with World(world, fault_tolerant=True, timeout=20.0, run_timeout=90.0) as w:
        got = w.run(train_over_quorum, case)
        segment = w.segment_name
    assert not os.path.exists(f"/dev/shm/{segment}")
    assert got[victim] == RankLost(victim, -9)
    # the replica killed at step s is in the mean of the syncs after steps t <= s only
    want = simulate(case, alive=lambda i, t: i != victim or t <= step)
    survivors = [r for r in range(world) if r != victim]
    # the survivors see the replica leave at the next quorum: a sync at or after the kill (none
    # after an inner step past the last sync: H = 2, 7 steps, killed at step 6)
    seen = phase == "outer" or any((t + 1) % H == 0 for t in range(step, steps))
    for r in survivors:
        assert got[r]["steps"] == steps // H           # every outer step committed once
        assert any(f"replica {victim} left" in c for c in got[r]["changes"]) == seen
        for s in range(steps):
            for name, value in want[s][r].items():
                np.testing.assert_allclose(got[r]["history"][s][name], value, rtol=0,
                                           atol=1e-12, err_msg=f"{name} after step {s}")


def _refused(**kw):
    import minidist.distributed as dist
    from minidist.optim import SGD
    from minidist.parallel.diloco import DiLoCo
    from minidist.parallel.fault_tolerance import Manager
    from parallel.diloco.diloco_cases import make_model
    model = make_model(case_of())
    inner, outer = SGD(model.parameters(), lr=0.1), SGD(model.parameters(), lr=0.7)
    manager = Manager(lambda s: None, lambda: {}, num_replicas=kw.pop("num_replicas", None))
    with pytest.raises(ValueError) as e:
        DiLoCo(model, inner, outer, sync_every=2, manager=manager, **kw)
    dist.destroy_process_group()
    return str(e.value)


@pytest.mark.parametrize("kw, words", [
    (dict(group="world"), "the replicas are the manager's"),
    (dict(fragment_sync_delay=1), "fragment_sync_delay=0"),
    (dict(outer_grad_format="bf16"), "full precision"),
])
def test_diloco_over_a_manager_refuses_what_it_does_not_do(kw, words):
    import minidist.distributed as dist
    dist.init_process_group()
    assert words in _refused(**kw)
