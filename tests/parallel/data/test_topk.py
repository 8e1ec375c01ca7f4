"""Top-K sparsification with error feedback: DDP at k = n, the algorithm at k < n."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World

import parallel.data.ddp_cases as C
from parallel.data.test_hooks import grads_of, make_bucket, shapes_st


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16), cap=st.sampled_from([1e-6, 25.0]),
       dtype=st.sampled_from(["float32", "float64"]))
def test_topk_at_k_equal_n_is_ddp_bit_for_bit(world, seed, cap, dtype):
    base = dict(world=world.world_size, dtype=dtype, seed=seed, steps=3, micro=1, batch=2,
                d_in=4, hidden=5, d_out=3, optimizer="adamw", clip=None, strategy="ddp",
                bucket_cap_mb=cap)
    plain = world.run(C.train_on_rank, base)
    topk = world.run(C.train_on_rank, dict(base, topk_density=1.0))
    for a, b in zip(plain, topk):
        for name in a["params"]:
            np.testing.assert_array_equal(a["params"][name], b["params"][name])


def run_topk(seed, shapes, density, steps):
    """On every rank: the hook's result and residual at each step."""
    from minidist import backend
    import minidist.distributed as dist
    from minidist.parallel.data.hooks import GradBucket
    from minidist.parallel.data.topk import TopKState, topk_hook
    state = TopKState(None, density=density)
    out = []
    for step in range(steps):
        b = make_bucket(shapes, grads_of(seed + step, dist.get_rank(), shapes, "float64"))
        result = topk_hook(state, GradBucket(b, True)).wait()
        out.append(dict(result=backend.to_host(result).copy(),
                        residual=backend.to_host(state.error_dict[0]).copy()))
    return out


def simulate_topk(seed, shapes, density, steps, n_ranks):
    """Every rank's residual kept in one process; the average of what each sent."""
    residual = [0.0] * n_ranks
    n = sum(a * b for a, b in shapes)
    k = min(n, max(1, int(np.ceil(density * n))))
    out = []
    for step in range(steps):
        total = np.zeros(n)
        mine = []
        for r in range(n_ranks):
            g = np.concatenate([a.reshape(-1) for a in grads_of(seed + step, r, shapes,
                                                               "float64")])
            x = g + residual[r]
            top = np.argsort(-np.abs(x), kind="stable")[:k]
            total[top] += x[top]
            residual[r] = x.copy()
            residual[r][top] = 0
            mine.append(residual[r])
        out.append(dict(result=total / n_ranks, residual=mine))
    return out


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), shapes=shapes_st, density=st.sampled_from([0.1, 0.3, 0.6]))
def test_topk_below_n_equals_the_algorithm_with_every_ranks_residual(world, seed, shapes,
                                                                   density):
    n = sum(a * b for a, b in shapes)
    if np.ceil(density * n) >= n:
        density = (n - 1) / n if n > 1 else density
    got = world.run(run_topk, seed, shapes, density, 3) if n > 1 else None
    if got is None:
        return
    want = simulate_topk(seed, shapes, density, 3, world.world_size)
    for r, rank_steps in enumerate(got):
        for g, w in zip(rank_steps, want):
            np.testing.assert_allclose(g["result"], w["result"], rtol=0, atol=1e-12)
            np.testing.assert_array_equal(g["residual"], w["residual"][r])
    assert all(np.array_equal(g[-1]["result"], got[0][-1]["result"]) for g in got)


def test_topk_sends_k_indices_and_values_per_rank(world):
    import minidist.distributed as dist

    def sent(seed):
        before = dist.get_stats().bytes_sent
        run_topk(seed, [(10, 10)], 0.05, 1)
        return dist.get_stats().bytes_sent - before
    n = world.world_size
    for b in world.run(sent, 0):
        assert b == (n - 1) * 5 * (8 + 8)      # ring all-gather of k int64 + k float64


@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**16), resume_at=st.integers(1, 4),
       cap=st.sampled_from([1e-6, 25.0]))
@pytest.mark.parametrize("via", ["checkpoint", "healing", "pickle"])
def test_topk_resumed_from_its_state_dict_takes_the_uninterrupted_runs_steps(
        world, tmp_path_factory, via, seed, resume_at, cap):
    """Top-K's residuals (``TopKState.state_dict()``) saved beside the model's and the
    optimizer's, through a checkpoint file per rank, the healing buffer or pickle: 6
    steps equal k steps, a fresh start from the saved states and 6 - k more, bit for
    bit; without the residuals the run parts."""
    case = dict(world=world.world_size, dtype="float64", seed=seed, steps=6, micro=1,
                batch=2, d_in=4, hidden=8, d_out=3, optimizer="adamw", bucket_cap_mb=cap,
                hook="topk", density=0.3)
    path = str(tmp_path_factory.mktemp("topk") / "ckpt")
    C.assert_resumed_run_takes_the_uninterrupted_runs_steps(world, case, resume_at, via, path)
