"""ZeRO with fp16 loss scaling: ``zero.step(scaler)`` skips a step on every rank
when any rank's gradients hold inf / NaN, and otherwise equals the unscaled run.

The scale is a power of two and the model float64, so scaling and unscaling
are exact: a run with the scaler must give the same bits as the run without
it that simply leaves out the poisoned step.
"""
import numpy as np
import pytest

from minidist.comm import RankFailedError, World

from ..data import ddp_cases as C

CASE = dict(world=2, dtype="float64", seed=3, steps=3, micro=1, batch=2, d_in=4, hidden=5,
            d_out=3, optimizer="adamw", clip=1.0)
POISONED = 1  # the step at which rank 1 feeds an inf


@pytest.fixture(scope="module")
def world():
    w = World(2, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


def _train(stage, mode):
    """mode: 'scaler' (rank 1's input holds inf at step POISONED), 'skip' (no
    scaler; step POISONED left out), 'no reduce' (a scaler that does not combine
    the flag over ranks)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.parallel import Zero1, Zero2, Zero3, found_inf_reduce
    from minidist.precision import GradScaler
    rank, b = dist.get_rank(), CASE["batch"]
    model = C.make_model(CASE, rank)
    cls, kw = C.optimizer_spec(CASE)
    zcls = {"zero1": Zero1, "zero2": Zero2, "zero3": Zero3}[stage]
    zero = zcls(model, cls, max_grad_norm=CASE["clip"], **kw)
    scaler = None
    if mode == "scaler":
        scaler = GradScaler(init_scale=2.0 ** 10, found_inf_reduce=found_inf_reduce())
    elif mode == "no reduce":
        scaler = GradScaler(init_scale=2.0 ** 10)
    elif mode == "own flag":  # combines nothing: each rank decides on its own shard
        scaler = GradScaler(init_scale=2.0 ** 10, found_inf_reduce=lambda flag: flag)
    x, y = C.data(CASE)
    scales = []
    for s in range(CASE["steps"]):
        if s == POISONED and mode == "skip":
            continue
        xs = x[s, 0, rank * b:(rank + 1) * b].copy()
        if s == POISONED and rank == 1:
            xs[0, 0] = np.inf
        loss = C.mse(zero(Tensor(backend.from_host(xs))), y[s, 0, rank * b:(rank + 1) * b], 1)
        if scaler is not None:
            loss = scaler.scale(loss)
        loss.backward()
        zero.step(scaler)
        zero.zero_grad()
        if scaler is not None:
            scaler.update()
            scales.append(scaler.get_scale())
    if stage == "zero3":
        params = {k: backend.to_host(v).copy() for k, v in zero.full_state_dict().items()}
    else:
        params = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    return params, scales


@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_an_inf_on_one_rank_skips_the_step_on_every_rank(world, stage):
    scaled = world.run(_train, stage, "scaler")
    skipped = world.run(_train, stage, "skip")
    for (params, scales), (want, _) in zip(scaled, skipped):
        assert C.max_diff(params, want) == 0.0       # bit for bit: the step was skipped
        assert scales == [2.0 ** 10, 2.0 ** 9, 2.0 ** 9]  # backed off once, on every rank
    assert C.max_diff(scaled[0][0], scaled[1][0]) == 0.0


def test_without_the_combined_flag_half_a_step_is_taken(world):
    """Why the flag is combined: deciding on its own shard, rank 0 (whose shard
    stayed finite) updates it while rank 1 skips: after the all-gather the model
    has taken half a step, and the two scalers disagree from then on."""
    (p0, s0), (p1, s1) = world.run(_train, "zero2", "own flag")
    (want, _), _ = world.run(_train, "zero2", "skip")
    assert s0 != s1 and C.max_diff(p0, want) > 0


def test_a_scaler_that_does_not_combine_the_flag_is_refused():
    import minidist
    with pytest.raises(RankFailedError, match="found_inf_reduce"):
        minidist.launch(_train, 2, "zero2", "no reduce")
