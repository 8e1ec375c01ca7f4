"""DDP communication hooks: fp16 / bf16 compression and PowerSGD keep their promises.

Each rank draws its own gradients from (seed, rank), so the test can also compute
every rank's gradients in one place as the oracle.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World
from oracles.optional import require


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


def grads_of(seed, rank, shapes, dtype):
    rng = np.random.default_rng([seed, rank])
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def make_bucket(shapes, grads):
    """A real DDP bucket over parameters of ``shapes``, holding ``grads``."""
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.parallel.data.buckets import Bucket
    params = [Tensor(backend.from_host(np.zeros(s, g.dtype)), requires_grad=True)
              for s, g in zip(shapes, grads)]
    b = Bucket(0, params)
    for i, g in enumerate(grads):
        b.add(i, backend.from_host(g))
    return b


def run_hook(hook_name, seed, shapes, dtype="float32", state_kw=None, steps=1):
    """On every rank: the hook's result on its own gradients (and the state)."""
    from minidist import backend
    import minidist.distributed as dist
    from minidist.parallel.data import hooks, powersgd
    from minidist.parallel.data.hooks import GradBucket
    rank = dist.get_rank()
    out = []
    state = powersgd.PowerSGDState(None, **(state_kw or {}))
    for step in range(steps):
        grads = grads_of(seed + step, rank, shapes, dtype)
        b = make_bucket(shapes, grads)
        if hook_name == "powerSGD":
            old = state.error_dict.get(0)
            old = np.zeros(b.flat.size, dtype) if old is None else backend.to_host(old).copy()
            before = dist.get_stats().bytes_sent
            res = powersgd.powerSGD_hook(state, GradBucket(b, True)).wait()
            sent = dist.get_stats().bytes_sent - before
            out.append(dict(result=backend.to_host(res).copy(), old=old, sent=sent,
                            new=backend.to_host(state.error_dict.get(0, b.flat * 0)).copy(),
                            grad=np.concatenate([g.reshape(-1) for g in grads]),
                            elements=state.sent_elements.get(0)))
        else:
            res = getattr(hooks, hook_name)(None, GradBucket(b, True)).wait()
            out.append(backend.to_host(res).copy())
    return out


shapes_st = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=3)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st)
def test_fp16_hook_equals_rounding_then_all_reducing(world, seed, shapes):
    def oracle(seed, shapes):
        from minidist import backend
        import minidist.distributed as dist
        n = dist.get_world_size()
        g = np.concatenate([a.reshape(-1) for a in grads_of(seed, dist.get_rank(), shapes,
                                                              "float32")])
        c = backend.from_host(g.astype(np.float16))
        c /= n                                   # torch's hook: divide in fp16, then sum
        dist.all_reduce(c)
        return backend.to_host(c).astype(np.float32)
    got = world.run(run_hook, "fp16_compress_hook", seed, shapes)
    want = world.run(oracle, seed, shapes)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g[0], w)
    assert all(np.array_equal(g[0], got[0][0]) for g in got)


def bf16_round(x):
    """Round float32 to bf16 (nearest even) the plain way, for the oracle."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st)
def test_bf16_hook_sums_bf16_values_in_rank_order_on_every_rank(world, seed, shapes):
    got = world.run(run_hook, "bf16_compress_hook", seed, shapes)
    n = world.world_size
    total = None
    for r in range(n):
        g = np.concatenate([a.reshape(-1) for a in grads_of(seed, r, shapes, "float32")])
        part = bf16_round(bf16_round(g) / np.float32(n))
        total = part if total is None else bf16_round(total + part)
    for g in got:
        np.testing.assert_array_equal(g[0], total)


def test_bf16_codes_are_the_encoding_of_the_precision_module():
    from minidist import backend
    from minidist.precision import BF16, encode
    from minidist.parallel.data.hooks import bf16_codes, bf16_values
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 1e3
    x[:4] = [0.0, -0.0, 1e-40, -3.0e38]
    codes = bf16_codes(backend.from_host(x))
    np.testing.assert_array_equal(backend.to_host(codes),
                                  backend.to_host(encode(backend.from_host(x), BF16)))
    np.testing.assert_array_equal(backend.to_host(bf16_values(codes)), bf16_round(x))


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st, extra=st.integers(0, 2))
def test_powersgd_at_full_rank_equals_the_exact_average(world, seed, shapes, extra):
    r = max(min(n, m) for n, m in shapes) + extra           # >= min(rows, cols) of each
    kw = dict(matrix_approximation_rank=r, start_powerSGD_iter=0, min_compression_rate=0.0,
              use_error_feedback=False)
    got = world.run(run_hook, "powerSGD", seed, shapes, "float64", kw)
    exact = sum(np.concatenate([a.reshape(-1) for a in grads_of(seed, k, shapes, "float64")])
                for k in range(world.world_size)) / world.world_size
    for g in got:
        np.testing.assert_allclose(g[0]["result"], exact, rtol=1e-9, atol=1e-9)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st)
def test_powersgd_error_feedback_keeps_approximation_plus_residual(world, seed, shapes):
    kw = dict(matrix_approximation_rank=1, start_powerSGD_iter=0, min_compression_rate=0.0)
    for rank_steps in world.run(run_hook, "powerSGD", seed, shapes, "float64", kw, 3):
        for s in rank_steps:   # compressed + new residual = gradient + old residual
            np.testing.assert_allclose(s["result"] + s["new"], s["grad"] + s["old"],
                                       rtol=0, atol=1e-12)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st, r=st.integers(1, 3))
def test_powersgd_sends_r_times_n_plus_m_per_matrix(world, seed, shapes, r):
    def dense_bytes(sizes):
        """Bytes this rank sends all-reducing float64 arrays of these sizes."""
        from minidist.backend import xp
        import minidist.distributed as dist
        before = dist.get_stats().bytes_sent
        for k in sizes:
            dist.all_reduce(xp.zeros(k, dtype=xp.float64))
        return dist.get_stats().bytes_sent - before
    kw = dict(matrix_approximation_rank=r, start_powerSGD_iter=0, min_compression_rate=0.0)
    got = world.run(run_hook, "powerSGD", seed, shapes, "float64", kw)
    p_elems = sum(min(n, m, r) * n for n, m in shapes)
    q_elems = sum(min(n, m, r) * m for n, m in shapes)
    assert got[0][0]["elements"] == p_elems + q_elems
    assert p_elems + q_elems == sum(min(n, m, r) * (n + m) for n, m in shapes)
    want = world.run(dense_bytes, [p_elems, q_elems])
    assert [g[0]["sent"] for g in got] == want


def test_powersgd_compresses_exactly_where_torch_does():
    """torch's _should_compress: compress only if rate * r(n + m) < n * m."""
    from minidist.parallel.data.powersgd import worth_compressing
    _should_compress = require(
        "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook")._should_compress
    for n in range(1, 13):
        for m in range(1, 13):
            for r in range(1, 5):
                for rate in (0.0, 0.5, 1.0, 2.0, 3.0):
                    want = _should_compress(n, m, min(n, m, r), rate)[0]
                    assert worth_compressing((n, m), r, rate) == want, (n, m, r, rate)


def test_powersgd_at_the_boundary_sends_the_exact_average(world):
    """4 x 4 and 3 x 6 at r = 1, rate 2: 2 * (n + m) = n * m, not worth it: the
    exact mean, every number sent; 4 x 5 (18 < 20) is compressed."""
    kw = dict(matrix_approximation_rank=1, start_powerSGD_iter=0)
    shapes = [(4, 4), (3, 6)]
    got = world.run(run_hook, "powerSGD", 7, shapes, "float64", kw)
    exact = sum(np.concatenate([a.reshape(-1) for a in grads_of(7, k, shapes, "float64")])
                for k in range(world.world_size)) / world.world_size
    for g in got:
        np.testing.assert_allclose(g[0]["result"], exact, rtol=1e-12, atol=1e-12)
        assert g[0]["elements"] == 16 + 18
    for g in world.run(run_hook, "powerSGD", 7, [(4, 5)], "float64", kw):
        assert g[0]["elements"] == 4 + 5


def test_register_comm_hook_twice_is_an_error():
    from minidist.comm import launch

    def fn():
        from minidist.nn import Linear
        from minidist.parallel import DistributedDataParallel
        from minidist.parallel.data.hooks import fp16_compress_hook
        ddp = DistributedDataParallel(Linear(2, 2))
        ddp.register_comm_hook(None, fp16_compress_hook)
        try:
            ddp.register_comm_hook(None, fp16_compress_hook)
        except RuntimeError as e:
            return str(e)
        return "no error"
    assert "only once" in launch(fn, 1)[0]


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**16), resume_at=st.integers(1, 5), warm_start=st.booleans(),
       cap=st.sampled_from([1e-6, 25.0]))
@pytest.mark.parametrize("via", ["checkpoint", "healing", "pickle"])
def test_powersgd_resumed_from_its_state_dict_takes_the_uninterrupted_runs_steps(
        world, tmp_path_factory, via, seed, resume_at, warm_start, cap):
    """PowerSGD's memory (residuals, warm-start Q's, ``iter`` against
    ``start_powerSGD_iter``, the generator of Q's draws) saved beside the model's and the
    optimizer's, through a checkpoint file per rank, the healing buffer or torch's pickle
    surface: 6 steps equal k steps (before or after the switch at step 2), a fresh start
    from the saved states and 6 - k more, bit for bit; without the memory the run parts."""
    import parallel.data.ddp_cases as C
    case = dict(world=world.world_size, dtype="float64", seed=seed, steps=6, micro=1,
                batch=2, d_in=4, hidden=8, d_out=3, optimizer="adamw", bucket_cap_mb=cap,
                hook="powersgd", powersgd=dict(matrix_approximation_rank=1,
                                               start_powerSGD_iter=2, warm_start=warm_start))
    path = str(tmp_path_factory.mktemp("powersgd") / "ckpt")
    C.assert_resumed_run_takes_the_uninterrupted_runs_steps(world, case, resume_at, via, path)
