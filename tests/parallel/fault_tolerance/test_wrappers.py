"""torchft's DDP wrapper averages each gradient over the quorum, parameter by parameter:
the replicas must all-reduce the same parameters in the same order, so a parameter
without a gradient on some replica is refused, naming it, not paired with another."""
import numpy as np
import pytest

from minidist.comm import RankFailedError, World
from minidist.comm.launch import RankLost


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


HEAL_STEPS, DIES_AT, INF_AT_HEAL = 6, 2, 1     # replica 1 dies at step 2; an inf at step 1


def _spare_joins_under_a_scaler(scaler_in_state):
    """Replicas 0 and 1 train under a GradScaler, replica 2 is a spare; an inf at step
    INF_AT_HEAL backs the scale off, replica 1 dies at DIES_AT and the spare heals from
    replica 0 (with the scaler's state in the Manager's state, or without it). Returns
    the parameters and the scale after the last step, and the steps it trained."""
    from minidist import backend
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.parallel.fault_tolerance import (DistributedDataParallel, Manager,
                                                   OptimizerWrapper)
    from minidist.precision import GradScaler
    from parallel.fault_tolerance.ft_cases import _die
    rank = dist.get_rank()
    model = Linear(3, 2, dtype="float64", generator=backend.Generator(rank))
    inner = AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    scaler = GradScaler(init_scale=2.0 ** 10, growth_interval=2)
    cursor = {"next": 0}

    def state_dict():
        state = {"model": model.state_dict(), "optim": inner.state_dict(), "cursor": cursor}
        return dict(state, scaler=scaler.state_dict()) if scaler_in_state else state

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        cursor.update(state["cursor"])
        if scaler_in_state:
            scaler.load_state_dict(state["scaler"])

    manager = Manager(load_state_dict, state_dict, num_replicas=2, timeout=20.0)
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner, model)
    trained = []
    while cursor["next"] < HEAL_STEPS:
        if not optimizer.zero_grad():
            break
        step = cursor["next"]
        cursor["next"] += 1
        if (rank, step) == (1, DIES_AT):
            _die()
        x, y = (Tensor(backend.from_host(a)) for a in _batch(step, rank))
        scaler.scale(((model(x) - y) ** 2).mean()).backward()
        if (rank, step) == (0, INF_AT_HEAL):
            model.weight.grad[0, 0] = np.inf
        ddp.sync_gradients()
        scaler.step(optimizer)
        scaler.update()
        trained.append(step)
    return dict(params=[backend.to_host(p.data).copy() for p in model.parameters()],
                scale=scaler.get_scale(), tracker=scaler.state_dict()["_growth_tracker"],
                trained=trained)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # the inf step
@pytest.mark.parametrize("scaler_in_state", [True, False], ids=["with", "without"])
def test_a_spare_healed_with_the_scalers_state_trains_to_its_peers_parameters(
        scaler_in_state):
    """The scale is part of the state: the spare that steps in for replica 1 receives
    replica 0's scale (backed off by the inf, grown since) and growth tracker with the
    model and optimizer, and the two end bit for bit alike. Without it the spare keeps
    its initial scale, unscales the quorum's mean by another S than its peer, and the
    two part without a word (the case the docs warn about)."""
    with World(3, fault_tolerant=True, timeout=20.0, run_timeout=90.0) as w:
        got = w.run(_spare_joins_under_a_scaler, scaler_in_state)
    source, spare = got[0], got[2]
    assert isinstance(got[1], RankLost)
    assert spare["trained"] == [DIES_AT + 1, DIES_AT + 2, DIES_AT + 3]
    alike = [np.array_equal(a, b) for a, b in zip(source["params"], spare["params"])]
    if scaler_in_state:
        assert all(alike)
        assert (spare["scale"], spare["tracker"]) == (source["scale"], source["tracker"])
    else:
        assert not any(alike)
        assert (spare["scale"], spare["tracker"]) != (source["scale"], source["tracker"])


def test_a_step_the_scaler_skips_reaches_the_wrapped_optimizers_hooks():
    """GradScaler's skip through the wrapper runs the wrapped optimizer's step-skipped
    hooks (DiLoCo counts that iteration), and hooks registered on the wrapper are the
    wrapped optimizer's: they run where it steps, after the vote."""
    from minidist.nn.module import Parameter
    from minidist.backend import xp
    from minidist.optim import SGD
    from minidist.parallel.fault_tolerance import OptimizerWrapper
    from minidist.precision import GradScaler
    p = Parameter(xp.ones(3))
    inner = SGD([p], lr=0.1)
    wrapper = OptimizerWrapper(None, inner)   # no manager: a skip asks it nothing
    seen = []
    wrapper.register_step_skipped_hook(lambda opt, args, kwargs: seen.append(("skip", opt)))
    wrapper.register_step_post_hook(lambda opt, args, kwargs: seen.append(("post", opt)))
    p.grad = xp.asarray([1.0, float("inf"), 0.0])
    GradScaler().step(wrapper)
    assert seen == [("skip", inner)]
    inner.step()
    assert seen == [("skip", inner), ("post", inner)]
