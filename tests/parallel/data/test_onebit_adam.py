"""1-bit Adam: Adam during the warm-up, then the paper's algorithm (signs with one scale
per tensor, worker and server error feedback), against a one-process simulation."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


HYPER = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)


def start(seed, shapes):
    rng = np.random.default_rng([seed, 999])
    return [rng.standard_normal(s) for s in shapes]


def grad(seed, step, rank, shapes):
    rng = np.random.default_rng([seed, step, rank])
    return [rng.standard_normal(s) for s in shapes]


def run_onebit(seed, shapes, steps, freeze_step):
    """On every rank: the parameters after each step (rank r starts elsewhere)."""
    from minidist import backend
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.parallel.data.onebit_adam import OnebitAdam
    rank = dist.get_rank()
    params = [Tensor(backend.from_host(w + rank), requires_grad=True)
              for w in start(seed, shapes)]
    opt = OnebitAdam(params, freeze_step=freeze_step, **HYPER)
    before = dist.get_stats().bytes_sent
    out = []
    for step in range(steps):
        for p, g in zip(params, grad(seed, step, rank, shapes)):
            p.grad = backend.from_host(g)
        opt.step()
        out.append([backend.to_host(p.data).copy() for p in params])
    return dict(params=out, sent=dist.get_stats().bytes_sent - before)


def simulate(seed, shapes, steps, freeze_step, N):
    """N workers in one process: shared w, m, v; each worker's and server's errors."""
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    w = start(seed, shapes)
    m = [np.zeros(s) for s in shapes]
    v = [np.zeros(s) for s in shapes]
    worker_err, server_err = {}, {}
    out = []
    for step in range(steps):
        gs = [grad(seed, step, r, shapes) for r in range(N)]
        for k in range(len(shapes)):
            if step < freeze_step:                      # Adam on the mean gradient
                g = sum(gs[r][k] for r in range(N)) / N
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
            else:
                local = [b1 * m[k] + (1 - b1) * gs[r][k] for r in range(N)]
                m[k] = one_bit_average(local, k, worker_err, server_err, N).reshape(shapes[k])
            w[k] = w[k] - lr * (m[k] / (np.sqrt(v[k]) + eps) + wd * w[k])
        out.append([x.copy() for x in w])
    return out


def one_bit_average(local, k, worker_err, server_err, N):
    n = local[0].size
    size = -(-n // (8 * N)) * 8 * N
    chunk = size // N
    sign = lambda x: np.where(x >= 0, 1.0, -1.0)      # noqa: E731  sign(0) = +1
    xs, scales = [], []
    for r in range(N):
        x = np.zeros(size)
        x[:n] = local[r].reshape(-1)
        x += worker_err.get((k, r), 0.0)
        s = np.sqrt(np.sum(x * x) / size)
        worker_err[(k, r)] = x - s * sign(x)
        xs.append(sign(x))
        scales.append(s)
    out = np.zeros(size)
    for j in range(N):
        part = slice(j * chunk, (j + 1) * chunk)
        y = sum(scales[r] * xs[r][part] for r in range(N)) / N + server_err.get((k, j), 0.0)
        t = np.sqrt(np.sum(y * y) / chunk)
        server_err[(k, j)] = y - t * sign(y)
        out[part] = t * sign(y)
    return out[:n]


shapes_st = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 7)), min_size=1, max_size=3)


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st, freeze_step=st.integers(0, 3))
def test_onebit_adam_is_adam_then_the_compressed_algorithm(world, seed, shapes, freeze_step):
    steps = freeze_step + 4
    got = [r["params"] for r in world.run(run_onebit, seed, shapes, steps, freeze_step)]
    want = simulate(seed, shapes, steps, freeze_step, world.world_size)
    for rank_steps in got:
        for g_step, w_step in zip(rank_steps, want):
            for g, w in zip(g_step, w_step):
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)
    for r in range(1, world.world_size):   # the same bits on every rank
        assert all(np.array_equal(a, b) for a, b in zip(got[r][-1], got[0][-1]))


def test_compressed_stage_sends_a_bit_per_number_where_warm_up_sends_64(world):
    warm = world.run(run_onebit, 0, [(64, 64)], 2, 100)[0]["sent"]      # float64 all-reduce
    compressed = world.run(run_onebit, 0, [(64, 64)], 2, 0)[0]["sent"]
    n = world.world_size
    assert warm >= 2 * 2 * (n - 1) / n * 64 * 64 * 8
    assert compressed * 32 < warm
