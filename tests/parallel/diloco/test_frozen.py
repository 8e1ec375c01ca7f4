"""Frozen parameters (requires_grad=False) under DiLoCo and Streaming DiLoCo stay bit for
bit as they were: they are in no outer all-reduce (no bytes for them) and the outer
optimizer (its weight decay, its momentum) never steps them; the rest trains as the
one-process simulation of the algorithm with the same parameters frozen."""
import numpy as np
import pytest

from tests.distributed.worlds import world_fixture

from parallel.diloco.diloco_cases import case_of, simulate, snapshot, make_model, train_on_rank
from parallel.diloco.test_diloco import assert_close

DECAY = dict(lr=0.7, momentum=0.9, nesterov=True, weight_decay=0.1)

world = world_fixture([2])


@pytest.mark.parametrize("frozen, H, F, tau, alpha", [
    (("fc1.weight", "fc3.bias"), 3, 1, 0, 0.0),      # DiLoCo
    (("fc2.weight", "fc2.bias"), 6, 3, 1, 0.5),      # Streaming: fragment 1 wholly frozen
])
def test_frozen_parameters_stay_and_the_rest_matches_the_simulation(world, frozen, H, F,
                                                                    tau, alpha):
    case = case_of(world=2, seed=4, H=H, F=F, tau=tau, alpha=alpha, steps=2 * H + 1,
                   outer=DECAY, frozen=frozen)
    got, want = world.run(train_on_rank, case), simulate(case)
    start = snapshot(make_model(case))               # rank 0's, broadcast to every replica
    for step in range(case["steps"]):
        for rank in range(2):
            assert_close(got[rank][step], want[step][rank])
            for name in frozen:
                assert np.array_equal(got[rank][step][name], start[name]), (step, name)


def outer_bytes(case):
    """The bytes this rank sent in DiLoCo's outer all-reduces over the case's run."""
    import minidist.distributed as dist
    before = dist.get_stats().per_collective.get("all_reduce", {}).get("bytes_sent", 0)
    train_on_rank(case)
    return dist.get_stats().per_collective["all_reduce"]["bytes_sent"] - before


def test_frozen_parameters_put_no_bytes_on_the_outer_all_reduce(world):
    """Two syncs of a world of 2 (a ring: 2 (N-1)/N n values of 8 bytes each per sync)
    over the trainable values only: fc2's 4 x 4 + 4 = 20 of the net's 46 are frozen."""
    case = case_of(world=2, seed=2, H=2, steps=4, frozen=("fc2.weight", "fc2.bias"))
    for sent in world.run(outer_bytes, case):
        assert sent == 2 * 8 * (46 - 20)


def unfreeze_mid_round(case):
    """DiLoCo built with fc1.weight frozen and an outer optimizer over the trainable
    parameters only; fc1.weight unfrozen before the first sync: the sync's error."""
    from minidist.optim import SGD, AdamW
    from minidist.parallel.diloco import DiLoCo
    from parallel.diloco.diloco_cases import batch, loss_backward
    model = make_model(case)
    inner = AdamW(model.parameters(), lr=1e-3)
    outer = SGD([p for p in model.parameters() if p.requires_grad], lr=0.7)
    with DiLoCo(model, inner, outer, sync_every=2):
        inner.step()                                     # no sync yet
        model.fc1.weight.requires_grad = True
        loss_backward(model, *batch(case, 0, 0))
        try:
            inner.step()
        except RuntimeError as e:
            return str(e)
    return "no error"


def test_a_parameter_unfrozen_after_construction_is_refused_at_the_next_sync(world):
    """DiLoCo leaves the parameters frozen at its construction out of the outer step:
    one unfrozen later would never synchronise, and its replicas would drift apart."""
    for message in world.run(unfreeze_mid_round, case_of(frozen=("fc1.weight",))):
        assert message.startswith("parameters ['fc1.weight'] changed requires_grad after "
                                  "DiLoCo was built"), message
