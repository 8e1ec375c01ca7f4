"""DDP equals one process on the concatenated batch; its collectives are counted.

For world sizes 1..4 (each world stays up for the module while hypothesis sends
it cases), random bucket sizes, 1..3 micro-batches under ``no_sync``, SGD with
momentum or AdamW, with and without clipping: after k steps, every rank's
parameters equal single-process training on the N * B * micro samples of each
step. Float64: within 1e-12. Float32: within 2e-5, see the test.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World

from . import ddp_cases as C


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


@st.composite
def cases(draw, world, strategy, dtype="float64"):
    return dict(strategy=strategy, world=world, dtype=dtype,
                seed=draw(st.integers(0, 2**20)), steps=draw(st.integers(1, 3)),
                micro=draw(st.integers(1, 3)), batch=draw(st.integers(1, 3)),
                d_in=draw(st.integers(1, 6)), hidden=draw(st.integers(1, 8)),
                d_out=draw(st.integers(1, 4)),
                optimizer=draw(st.sampled_from(["sgd", "adamw", "amsgrad"])),
                clip=draw(st.sampled_from([None, 0.05, 10.0])),
                # from one bucket per parameter (1e-6 MB) to one for the whole model
                bucket_cap_mb=draw(st.sampled_from([1e-6, 2e-4, 1e-3, 25.0])),
                overlap=draw(st.booleans()), grad_view=draw(st.booleans()))


def check_equal(world, case, tol):
    ref = C.train_single(case)
    results = world.run(C.train_on_rank, case)
    for rank, res in enumerate(results):
        diff = C.max_diff(res["params"], ref)
        assert diff <= tol, f"rank {rank}: max |parallel - single| = {diff:.3e} > {tol}; {case}"
    return results


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_ddp_matches_single_process(world, data):
    check_equal(world, data.draw(cases(world.world_size, "ddp")), 1e-12)


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_naive_ddp_matches_single_process(world, data):
    check_equal(world, data.draw(cases(world.world_size, "naive")), 1e-12)


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_ddp_float32_matches_single_process(world, data):
    """Float32: the sums over ranks and micro-batches are reordered, so gradients
    differ by a few ulps (~1e-7 relative); 3 steps of lr <= 0.1 with weights
    of order 1 move parameters by about that times the number of steps, and
    AdamW's m / sqrt(v) can scale a relative error of a small gradient up to
    ~1e-6. 2e-5 leaves a margin of about 10x; a real bug (a missed micro-batch,
    a wrong divisor) moves the weights by 1e-3 or more."""
    check_equal(world, data.draw(cases(world.world_size, "ddp", "float32")), 2e-5)


def test_naive_is_one_all_reduce_per_parameter_and_ddp_one_per_bucket(world):
    n = world.world_size
    base = dict(world=n, dtype="float64", seed=1, steps=2, micro=3, batch=2, d_in=4,
                hidden=5, d_out=3, optimizer="sgd", clip=None)
    naive = world.run(C.train_on_rank, dict(base, strategy="naive"))[0]
    assert naive["calls"].get("all_reduce", 0) == 6 * 2          # 6 parameters, 2 steps
    for cap in (1e-6, 1e-4, 25.0):
        ddp = world.run(C.train_on_rank, dict(base, strategy="ddp", bucket_cap_mb=cap))[0]
        # 3 micro-batches under no_sync: one all-reduce per bucket per step, not per micro
        assert ddp["calls"].get("all_reduce", 0) == ddp["buckets"] * 2
    assert {1, 6} <= {world.run(C.train_on_rank, dict(base, strategy="ddp", bucket_cap_mb=c))
                      [0]["buckets"] for c in (1e-6, 25.0)}


def test_unused_parameter_is_a_loud_error_naming_it(world):
    def fn():
        from minidist.autograd import Tensor
        from minidist.backend import xp
        from minidist.nn import Linear, Module
        from minidist.parallel import DistributedDataParallel

        class TwoHeads(Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = Linear(3, 2), Linear(3, 2)

            def forward(self, x):
                return self.used(x)

        ddp = DistributedDataParallel(TwoHeads())
        x = Tensor(xp.ones((2, 3), dtype="float32"))
        ddp(x).sum().backward()
        try:
            ddp(x)
        except RuntimeError as e:
            return str(e)
        return "no error"
    for msg in world.run(fn):
        assert "unused.weight" in msg and "unused.bias" in msg and "'used.weight'" not in msg


def test_parameter_sync_check_finds_a_single_flipped_bit(world):
    def fn(flip):
        import minidist.distributed as dist
        from minidist import backend
        from minidist.nn import MLP
        from minidist.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(MLP(8, 16))
        ddp.check_parameters_in_sync()          # right after the broadcast: in sync
        if flip and dist.get_rank() == dist.get_world_size() - 1:
            w = ddp.module.c_proj.weight.data
            bits = backend.bits(w)
            bits[3, 5] ^= bits.dtype.type(1)    # the lowest mantissa bit of one element
        try:
            ddp.check_parameters_in_sync()
        except RuntimeError as e:
            return str(e)
        return "in sync"
    assert world.run(fn, False) == ["in sync"] * world.world_size
    if world.world_size > 1:
        for msg in world.run(fn, True):
            assert "c_proj.weight" in msg and "c_fc" not in msg


def test_fingerprint_changes_with_any_one_element():
    from minidist import backend
    from minidist.parallel.data.sync_check import fingerprint
    rng = np.random.default_rng(0)
    a = rng.standard_normal(50)
    h0 = backend.to_host(fingerprint(backend.from_host(a)))
    for i in range(50):
        b = a.copy()
        b[i] = np.nextafter(b[i], np.inf)
        assert not np.array_equal(backend.to_host(fingerprint(backend.from_host(b))), h0)
    swapped = a.copy()
    swapped[[0, 1]] = swapped[[1, 0]]              # same sum, different elements
    assert not np.array_equal(backend.to_host(fingerprint(backend.from_host(swapped))), h0)


def test_found_inf_reduce_makes_every_rank_skip_when_one_overflows(world):
    def fn():
        import minidist.distributed as dist
        from minidist.autograd import Tensor
        from minidist.backend import to_host, xp
        from minidist.optim import SGD
        from minidist.parallel import found_inf_reduce
        from minidist.precision import GradScaler
        w = Tensor(xp.ones(3, dtype="float32"), requires_grad=True)
        opt = SGD([w], lr=0.1)
        scaler = GradScaler(found_inf_reduce=found_inf_reduce())
        scaler.scale((w * w).sum()).backward()
        if dist.get_rank() == dist.get_world_size() - 1:
            w.grad[0] = float("inf")               # only the last rank overflows
        scaler.step(opt)
        scaler.update()
        return to_host(w.data).copy()
    for got in world.run(fn):
        assert (got == 1.0).all()                  # no rank stepped


def test_backward_writes_each_gradient_into_its_bucket(world):
    """gradient_as_bucket_view: p.grad is the bucket's view from the first forward
    on (backward added the gradient there: no array of its own); off, p.grad is
    None until DDP points it at the bucket after backward."""
    def fn(view):
        from minidist.autograd import Tensor
        from minidist.backend import xp
        from minidist.nn import Linear, Sequential
        from minidist.parallel import DistributedDataParallel
        model = Sequential(Linear(3, 4), Linear(4, 2))
        ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4, gradient_as_bucket_view=view)
        out = ddp(Tensor(xp.ones((2, 3))))
        homes = [p.grad for p in model.parameters()]
        out.sum().backward()
        slots = {id(p): b.views[i] for b in ddp.buckets for i, p in enumerate(b.params)}
        homes_ok = all((h is slots[id(p)]) if view else (h is None)
                       for h, p in zip(homes, model.parameters()))
        return homes_ok, all(p.grad is slots[id(p)] for p in model.parameters())
    for view in (True, False):
        for homes_ok, grads_are_views in world.run(fn, view):
            assert homes_ok and grads_are_views
