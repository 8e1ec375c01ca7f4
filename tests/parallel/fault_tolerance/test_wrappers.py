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
