"""DiLoCo under a GradScaler: a step the scaler skips (an inf / NaN gradient on one
replica only) is still one of the H inner steps, so every replica synchronises after
the same iterations and the run equals the simulation in which that replica takes no
step there (the replicas' outer gradients paired from the same round)."""
import pytest

from tests.distributed.worlds import world_fixture

from parallel.diloco.diloco_cases import (batch, case_of, fragments_of, make_inner,
                                          make_model, simulate, snapshot)
from parallel.diloco.test_diloco import assert_close

world = world_fixture([2])


def train_with_scaler(case):
    """DiLoCo with a GradScaler on this rank; at (rank, step) in ``case["skipped"]`` a
    gradient is made inf after backward, so the scaler skips that step. Returns the
    parameters after every step."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.optim import SGD
    from minidist.parallel.diloco import DiLoCo
    from minidist.precision import GradScaler
    rank = dist.get_rank()
    model = make_model(case, seed_offset=rank)
    inner = make_inner(case, model.parameters())
    outer = SGD(model.parameters(), **case["outer"])
    scaler = GradScaler(init_scale=2.0 ** 4)          # a power of two: g * S / S is exact
    frags = fragments_of(model, case["F"]) if case["F"] > 1 else None
    out = []
    with DiLoCo(model, inner, outer, sync_every=case["H"], fragments=frags,
                fragment_sync_delay=case["tau"]):
        for step in range(case["steps"]):
            x, y = batch(case, step, rank)
            diff = model(Tensor(backend.from_host(x))) - Tensor(backend.from_host(y))
            scaler.scale((diff * diff).mean()).backward()
            if (rank, step) in case["skipped"]:         # an overflow on this replica alone
                model.fc1.weight.grad[0, 0] = float("inf")
            scaler.step(inner)
            scaler.update()
            inner.zero_grad()
            out.append(snapshot(model))
    return out


@pytest.mark.parametrize("H, F, tau, skipped", [
    (2, 1, 0, [(1, 0)]),                  # the old code paired replica 0's step 2 with
                                          # replica 1's step 3, and so on
    (2, 1, 0, [(1, 1), (0, 3)]),          # the skipped step is the one of the sync
    (2, 1, 0, [(0, 2), (1, 2)]),          # every replica skips: the syncs stay after
                                          # steps 2 and 4
    (4, 2, 1, [(0, 0), (1, 4)]),          # Streaming: the merge after tau steps
])
def test_a_step_the_scaler_skips_on_one_replica_is_still_an_inner_step(world, H, F, tau,
                                                                       skipped):
    case = case_of(world=2, seed=6, H=H, F=F, tau=tau, steps=2 * H + 1, skipped=skipped)
    got, want = world.run(train_with_scaler, case), simulate(case)
    for step in range(case["steps"]):
        for rank in range(2):
            assert_close(got[rank][step], want[step][rank])
