"""DDP's bucket timeline: with overlap, communication starts while backward computes.

Structural properties only (which event comes before which), never durations:
the machine running the tests may be loaded.
"""
import numpy as np
import pytest

from minidist.comm import World


@pytest.fixture(scope="module")
def world():
    w = World(2, timeout=20.0, run_timeout=90.0, link_gbps=1.0)
    yield w
    w.close()


def timeline_of(overlap, hook=None, steps=2):
    """One rank's timeline of its last step, on an 8-layer MLP with 1 bucket per layer."""
    from minidist.autograd import Tensor
    from minidist.backend import Generator
    from minidist.nn import Linear, Sequential
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.data import hooks, powersgd
    import minidist.distributed as dist
    model = Sequential(*[Linear(256, 256, generator=Generator(i)) for i in range(8)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.27, overlap=overlap)
    if hook == "fp16":
        ddp.register_comm_hook(None, hooks.fp16_compress_hook)
    elif hook == "powerSGD":
        ddp.register_comm_hook(powersgd.PowerSGDState(None, 2, start_powerSGD_iter=0),
                               powersgd.powerSGD_hook)
    x = Tensor(Generator(10 + dist.get_rank()).normal((512, 256)))
    for _ in range(steps):
        ddp(x).sum().backward()
    from minidist.backend import to_host
    grads = np.concatenate([to_host(p.grad).reshape(-1) for p in model.parameters()])
    return ddp.timeline, len(ddp.buckets), grads


@pytest.mark.parametrize("hook", [None, "fp16", "powerSGD"])
def test_first_bucket_communicates_before_backward_ends(world, hook):
    for timeline, n_buckets, _ in world.run(timeline_of, True, hook):
        events, end = timeline[:-1], timeline[-1]["backward_end_ms"]
        assert n_buckets == len(events) == 8
        first = events[0]
        assert first["ready_ms"] <= first["comm_start_ms"] < end
        assert first["hidden_ms"] > 0
        for e in events:
            assert e["ready_ms"] <= e["comm_start_ms"] <= e["comm_end_ms"]
        assert 0.0 < timeline[-1]["hidden_fraction"] <= 1.0


def test_without_overlap_no_communication_starts_before_backward_ends(world):
    for timeline, _, _ in world.run(timeline_of, False):
        end = timeline[-1]["backward_end_ms"]
        assert all(e["comm_start_ms"] >= end for e in timeline[:-1])
        assert timeline[-1]["hidden_fraction"] == 0.0


@pytest.mark.parametrize("hook", ["fp16", "powerSGD"])
def test_hooked_gradients_are_the_same_bits_on_every_rank(world, hook):
    grads = [g for _, _, g in world.run(timeline_of, True, hook)]
    np.testing.assert_array_equal(grads[0], grads[1])


def test_timeline_renders_one_row_per_bucket(world):
    from minidist.parallel.data.timeline import render
    timeline, n_buckets, _ = world.run(timeline_of, True)[0]
    text = render(timeline)
    assert text.count("bucket") == n_buckets and "hidden fraction" in text
