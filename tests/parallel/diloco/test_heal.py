"""A replacement process joins DiLoCo over a fault-tolerance Manager at a sync of the
survivors and heals from one of them: its model is then its source's, with none of the
round's inner steps of its own, so it sends no outer gradient to that sync (the mean is
over the replicas that took the round's steps) and starts the next round from
theta_global with its source's inner and outer state."""
import os
import time

import numpy as np
import pytest

from minidist.comm import World

from parallel.diloco.diloco_cases import (batch, case_of, loss_backward, make_inner,
                                          make_model, simulate, snapshot)

KILLED = 2


def train_with_a_replacement(case):
    """Three replicas of one rank; rank 2 dies before inner step ``case["kill"]``; its
    replacement heals at a later sync. Every member stops one round after the sync the
    replacement joined (a number in the healed state, so all stop alike). Returns the
    parameters after every inner step this process took, keyed by step, and the join."""
    import minidist.distributed as dist
    from minidist.optim import SGD
    from minidist.parallel.diloco import DiLoCo
    from minidist.parallel.fault_tolerance import Manager
    rank = dist.get_rank()
    replacement = int(os.environ.get("MINIDIST_REPLACEMENT", "0"))
    model = make_model(case, seed_offset=rank)
    inner = make_inner(case, model.parameters())
    outer = SGD(model.parameters(), **case["outer"])
    run = {"joined": -1}

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict(), "run": dict(run)}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])
        run.update(state["run"])

    manager = Manager(load_state_dict, state_dict, timeout=20.0)
    out = {}
    with DiLoCo(model, inner, outer, sync_every=case["H"], manager=manager) as diloco:
        if replacement:                              # healed and joined inside DiLoCo()
            out[diloco.local_step - 1] = snapshot(model)
        while True:
            step = diloco.local_step                 # 0-based index of the next step
            if run["joined"] < 0 and step > case["kill"] and manager.num_participants() == 3:
                run["joined"] = step                 # the sync after step `step` had all 3
            if run["joined"] >= 0 and step >= run["joined"] + case["H"]:
                break
            if rank == KILLED and not replacement and step == case["kill"]:
                os.kill(os.getpid(), 9)
            loss_backward(model, *batch(case, step, rank))
            inner.step()
            inner.zero_grad()
            out[step] = snapshot(model)
            time.sleep(0.02)                         # steps enough for a process to start
    return {"history": out, "joined": run["joined"]}


def test_a_replacement_sends_no_outer_gradient_to_the_sync_it_joins():
    case = case_of(world=3, seed=8, H=2, kill=1, steps=400)
    with World(3, fault_tolerant=True, replacements=1, timeout=20.0,
               run_timeout=120.0) as w:
        got = w.run(train_with_a_replacement, case)
    joined = got[0]["joined"]
    assert joined > case["kill"] and all(g["joined"] == joined for g in got)
    # replica 2 is in no mean from the sync after its death through the one it joins
    want = simulate(dict(case, steps=joined),
                    alive=lambda i, t: i != KILLED or t <= case["kill"])
    for step in range(joined):
        for rank in (0, 1):
            for name, value in want[step][rank].items():
                np.testing.assert_allclose(got[rank]["history"][step][name], value, rtol=0,
                                           atol=1e-12, err_msg=f"{name} after step {step}")
    # the replacement right after the sync it joined holds theta_global, as its peers
    for name, value in got[0]["history"][joined - 1].items():
        assert np.array_equal(got[KILLED]["history"][joined - 1][name], value), name
