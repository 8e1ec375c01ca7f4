"""torchft's DDP wrapper averages each gradient over the quorum, parameter by parameter:
the replicas must all-reduce the same parameters in the same order, so a parameter
without a gradient on some replica is refused, naming it, not paired with another."""
import numpy as np
import pytest

from minidist.comm import RankFailedError, World


def _routed_step(routes):
    """Two same-shape branches; replica r's forward goes through the branches named in
    ``routes[r]`` ("a", "b" or "ab").
    One step through the wrappers; returns this replica's gradients after the sync."""
    from minidist import backend
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.nn import Linear, Module
    from minidist.optim import SGD
    from minidist.parallel.fault_tolerance import (DistributedDataParallel, Manager,
                                                   OptimizerWrapper)

    class Routed(Module):
        def __init__(self):
            super().__init__()
            gen = backend.Generator(0)
            self.a = Linear(2, 2, dtype="float64", generator=gen)
            self.b = Linear(2, 2, dtype="float64", generator=gen)

        def forward(self, x, route):
            outs = [getattr(self, branch)(x) for branch in route]
            return outs[0] if len(outs) == 1 else outs[0] + outs[1]

    rank = dist.get_rank()
    model = Routed()
    manager = Manager(model.load_state_dict, model.state_dict, timeout=20.0)
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, SGD(model.parameters(), lr=0.1), model)
    optimizer.zero_grad()
    x = Tensor(backend.from_host(np.full((3, 2), 1.0 + rank)))
    ddp(x, routes[rank]).sum().backward()
    ddp.sync_gradients()
    optimizer.step()
    return {n: None if p.grad is None else backend.to_host(p.grad).copy()
            for n, p in model.named_parameters()}


@pytest.fixture           # one per test: a rank that fails closes its world
def world():
    w = World(2, timeout=20.0, run_timeout=60.0)
    yield w
    w.close()


def test_a_parameter_without_a_gradient_on_a_replica_is_refused_naming_it(world):
    """Replica 0's a and replica 1's b have the same shapes: averaged in turn, a's
    gradient on one replica would be paired with b's on the other."""
    with pytest.raises(RankFailedError, match=r"\['[ab]\.weight', '[ab]\.bias'\] received no gradient"):
        world.run(_routed_step, ("a", "b"))


def test_replicas_that_use_the_same_parameters_average_their_gradients(world):
    got = world.run(_routed_step, ("ab", "ab"))
    x0, x1 = np.full((3, 2), 1.0), np.full((3, 2), 2.0)
    want = (x0.sum(0) + x1.sum(0)) / 2                         # d sum(x W^T + c) / dW row
    for grads in got:
        for name in ("a.weight", "b.weight"):
            np.testing.assert_allclose(grads[name], np.stack([want, want]), rtol=0,
                                       atol=1e-12)


STEPS, INF_AT, ROWS = 5, 2, 4           # steps, the step with an inf on replica 1, rows each


def _batch(step, replica):
    rng = np.random.default_rng([step, replica])
    return rng.standard_normal((ROWS, 3)), rng.standard_normal((ROWS, 2))


def _train(replicas, through_wrapper):
    """STEPS steps of AdamW under a GradScaler, a gradient clip and a WarmupCosine
    schedule; at step INF_AT the last replica's gradient holds an inf. Through the
    fault-tolerance wrappers (one replica per rank, the batch of this rank), or
    (``through_wrapper`` False) on one process over every replica's batch at once,
    the plain optimizer. Returns the parameters, the lr and the scale after each step."""
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.nn import Linear
    from minidist.optim import AdamW, WarmupCosine, clip_grad_norm_
    from minidist.precision import GradScaler
    model = Linear(3, 2, dtype="float64", generator=backend.Generator(0))
    optimizer = AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    mine = range(replicas)
    if through_wrapper:
        import minidist.distributed as dist
        from minidist.parallel.fault_tolerance import (DistributedDataParallel, Manager,
                                                       OptimizerWrapper)
        manager = Manager(model.load_state_dict, model.state_dict, timeout=20.0)
        ddp = DistributedDataParallel(manager, model)
        optimizer = OptimizerWrapper(manager, optimizer, model)
        mine = [dist.get_rank()]
    scheduler = WarmupCosine(optimizer, warmup_steps=2, total_steps=STEPS)
    scaler = GradScaler(init_scale=2.0 ** 10, growth_interval=2)
    out = []
    for step in range(STEPS):
        optimizer.zero_grad()
        xs, ys = zip(*(_batch(step, r) for r in mine))
        x, y = (Tensor(backend.from_host(np.concatenate(a))) for a in (xs, ys))
        loss = ((model(x) - y) ** 2).mean()
        scaler.scale(loss).backward()
        if step == INF_AT and replicas - 1 in mine:
            model.weight.grad[0, 0] = np.inf
        if through_wrapper:
            ddp.sync_gradients()              # the mean over the quorum's batches
        scaler.unscale_(optimizer)
        clip_grad_norm_(model.parameters(), max_norm=0.5)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        out.append(dict(params=[backend.to_host(p.data).copy() for p in model.parameters()],
                        lr=optimizer.param_groups[0]["lr"], scale=scaler.get_scale()))
    return out


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # clipping the inf step
def test_grad_scaler_clip_and_lr_schedule_through_the_wrapper_equal_the_plain_optimizer(world):
    """The wrapper's param_groups and state are the wrapped optimizer's: the scheduler's
    lr and the scaler's unscale reach the optimizer that steps, and a step the scaler
    skips (an inf on one replica, on every replica after the average) is skipped by all,
    so 2 replicas of 4 rows take one process's steps on the 8 rows (float64, 1e-12)."""
    got = world.run(_train, 2, True)
    want = _train(2, False)
    assert want[INF_AT]["scale"] == want[INF_AT - 1]["scale"] / 2      # the skip happened
    for run in got:
        for g, w in zip(run, want):
            assert g["lr"] == w["lr"] and g["scale"] == w["scale"]
            for a, b in zip(g["params"], w["params"]):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
