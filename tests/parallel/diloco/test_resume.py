"""A DiLoCo run saved mid-round (each replica its model, inner optimizer and DiLoCo's
state: theta_global, the outer momentum, the inner step count) and loaded into a new
model takes the uninterrupted run's steps bit for bit."""
import numpy as np
import pytest

from minidist.comm import World

from parallel.diloco.diloco_cases import (batch, case_of, fragments_of, loss_backward,
                                          make_inner, make_model, snapshot, train_on_rank)


@pytest.fixture(scope="module")
def world():
    w = World(2, timeout=20.0, run_timeout=120.0)
    yield w
    w.close()


def train_resumed(case, stop, directory):
    """``train_on_rank``'s run, saved after ``stop`` inner steps and loaded into a new
    model, inner and outer optimizer and DiLoCo (built from other weights)."""
    import minidist.distributed as dist
    from minidist.checkpoint import load_checkpoint, save_checkpoint
    from minidist.optim import SGD
    from minidist.parallel.diloco import DiLoCo
    rank = dist.get_rank()
    path = f"{directory}/rank{rank}.ckpt"

    def build(seed_offset):
        model = make_model(case, seed_offset=seed_offset)
        inner = make_inner(case, model.parameters())
        outer = SGD(model.parameters(), **case["outer"])
        frags = None if case["F"] == 1 else fragments_of(model, case["F"])
        diloco = DiLoCo(model, inner, outer, sync_every=case["H"], fragments=frags,
                        fragment_sync_delay=case["tau"])
        return model, inner, diloco.__enter__()

    model, inner, diloco = build(rank)
    for step in range(case["steps"]):
        if step == stop:
            save_checkpoint(path, model, inner, extra={"diloco": diloco.state_dict()},
                            rank0_only=False)
            diloco.__exit__(None, None, None)
            model, inner, diloco = build(rank + 10)
            extra = load_checkpoint(path, model, inner)
            diloco.load_state_dict(extra["diloco"])
        loss_backward(model, *batch(case, step, rank))
        inner.step()
        inner.zero_grad()
    diloco.__exit__(None, None, None)
    return snapshot(model)


@pytest.mark.parametrize("H, F, tau, stop", [(3, 1, 0, 4), (3, 1, 0, 3), (6, 3, 1, 5)],
                         ids=["mid-round", "right-after-a-sync", "streaming"])
def test_a_diloco_run_resumed_mid_way_takes_the_uninterrupted_runs_steps(
        world, tmp_path, H, F, tau, stop):
    case = case_of(world=2, seed=5, H=H, F=F, tau=tau, steps=9)
    whole = [steps[-1] for steps in world.run(train_on_rank, case)]
    resumed = world.run(train_resumed, case, stop, str(tmp_path))
    for want, got in zip(whole, resumed):
        for name in want:
            assert np.array_equal(want[name], got[name]), name


def test_saving_while_a_fragment_synchronises_is_refused(world, tmp_path):
    """With a delay the outer gradient is on the wire across inner steps: that cannot
    be saved, and the error says when it can."""
    from minidist.comm import RankFailedError
    case = case_of(world=2, seed=5, H=6, F=3, tau=1, steps=8)
    with pytest.raises(RankFailedError, match="in flight"):   # fragment 1: steps 4 to 5
        world.run(train_resumed, case, 4, str(tmp_path))
