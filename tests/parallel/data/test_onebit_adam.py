"""1-bit Adam: Adam during the warm-up, then the paper's algorithm on the model's flattened
momentum (signs with one scale for the whole vector, worker and server error feedback),
against a one-process simulation."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import RankFailedError, World


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


def run_onebit(seed, shapes, steps, freeze_step, empty_steps=0):
    """On every rank: the parameters after each step (rank r starts elsewhere);
    ``empty_steps``: steps with no gradient at all, taken first and not counted."""
    from minidist import backend
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.parallel.data.onebit_adam import OnebitAdam
    rank = dist.get_rank()
    params = [Tensor(backend.from_host(w + rank), requires_grad=True)
              for w in start(seed, shapes)]
    opt = OnebitAdam(params, freeze_step=freeze_step, **HYPER)
    for _ in range(empty_steps):
        opt.step()
    before, msgs = dist.get_stats().bytes_sent, dist.get_stats().msgs_sent
    out = []
    for step in range(steps):
        for p, g in zip(params, grad(seed, step, rank, shapes)):
            p.grad = backend.from_host(g)
        opt.step()
        out.append([backend.to_host(p.data).copy() for p in params])
    return dict(params=out, sent=dist.get_stats().bytes_sent - before,
                msgs=dist.get_stats().msgs_sent - msgs)


def simulate(seed, shapes, steps, freeze_step, N):
    """N workers in one process: shared w, m, v; the algorithm on the flattened vector
    (every parameter back to back), each worker's error and each server chunk's error
    laid out over it."""
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    sizes = [int(np.prod(s)) for s in shapes]
    w = np.concatenate([x.reshape(-1) for x in start(seed, shapes)])     # (n,)
    m, v = np.zeros(w.size), np.zeros(w.size)
    worker_err, server_err = {}, {}
    out = []
    for step in range(steps):
        gs = [np.concatenate([g.reshape(-1) for g in grad(seed, step, r, shapes)])
              for r in range(N)]                                         # (n,) each
        if step < freeze_step:                          # Adam on the mean gradient
            g = sum(gs) / N
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
        else:
            local = [b1 * m + (1 - b1) * gs[r] for r in range(N)]
            m = one_bit_average(local, worker_err, server_err, N)
        w = w - lr * (m / (np.sqrt(v) + eps) + wd * w)
        pieces = np.split(w, np.cumsum(sizes)[:-1])
        out.append([x.reshape(s) for x, s in zip(pieces, shapes)])
    return out


def one_bit_average(local, worker_err, server_err, N):
    """Tang et al.'s compressed average of the flat vectors ``local`` (one per worker)."""
    n = local[0].size
    size = -(-n // (8 * N)) * 8 * N
    chunk = size // N
    sign = lambda x: np.where(x >= 0, 1.0, -1.0)      # noqa: E731  sign(0) = +1
    xs, scales = [], []
    for r in range(N):
        x = np.zeros(size)
        x[:n] = local[r]
        x += worker_err.get(r, 0.0)
        s = np.sqrt(np.sum(x * x) / size)               # one scale for the whole vector
        worker_err[r] = x - s * sign(x)
        xs.append(sign(x))
        scales.append(s)
    out = np.zeros(size)
    for j in range(N):
        part = slice(j * chunk, (j + 1) * chunk)
        y = sum(scales[r] * xs[r][part] for r in range(N)) / N + server_err.get(j, 0.0)
        t = np.sqrt(np.sum(y * y) / chunk)
        server_err[j] = y - t * sign(y)
        out[part] = t * sign(y)
    return out[:n]


# two or more parameters: one scale for the flat vector differs from one per parameter
shapes_st = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 7)), min_size=2, max_size=4)


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


@pytest.mark.parametrize("freeze_step", [100, 0], ids=["warm-up", "compressed"])
def test_a_step_is_one_all_reduce_of_the_flat_vector_whatever_the_parameter_count(
        world, freeze_step):
    one = world.run(run_onebit, 0, [(8, 8)], 2, freeze_step)
    eight = world.run(run_onebit, 0, [(2, 4)] * 8, 2, freeze_step)     # the same 64
    assert [r["msgs"] for r in eight] == [r["msgs"] for r in one]
    # the same bytes, but for the mask of which parameters have a gradient: one number
    # more per parameter, in every warm-up all-reduce, once in the compression stage
    N, steps = world.world_size, 2
    masks = 1 if freeze_step == 0 else steps
    # over all ranks, at most N - 1 copies of each rank's mask (the one-shot all-reduce
    # of small vectors; the ring sends 2(N-1)/N)
    mask = masks * N * (N - 1) * 7 * 8
    assert 0 < sum(r["sent"] for r in eight) - sum(r["sent"] for r in one) <= mask


def _drop_a_gradient():
    """A compressed step with gradients for both parameters, then one for the first only."""
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.parallel.data.onebit_adam import OnebitAdam
    params = [Tensor(backend.from_host(np.ones(4)), requires_grad=True) for _ in range(2)]
    opt = OnebitAdam(params, freeze_step=0)
    for p in params:
        p.grad = backend.from_host(np.ones(4))
    opt.step()
    params[1].grad = None
    opt.step()


def test_a_changed_set_of_gradients_after_the_warm_up_is_refused():
    """The error feedback is laid out over the flat momentum: the same parameters must
    travel at every compressed step."""
    import minidist
    with pytest.raises(RankFailedError, match=r"zero_grad\(set_to_none=False\)"):
        minidist.launch(_drop_a_gradient, 2)


def _gradients_for_other_parameters(freeze_step, two_groups):
    """Two parameters of one shape; rank r gives a gradient to parameter r alone, so the
    flat vectors have one size everywhere. ``two_groups``: each in a param group of its
    own (rank 0's step then has nothing in group 1, rank 1's nothing in group 0)."""
    from minidist import backend
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.parallel.data.onebit_adam import OnebitAdam
    params = [Tensor(backend.from_host(np.ones(4)), requires_grad=True) for _ in range(2)]
    groups = [{"params": [p]} for p in params] if two_groups else params
    opt = OnebitAdam(groups, freeze_step=freeze_step)
    params[dist.get_rank()].grad = backend.from_host(np.ones(4))
    opt.step()


@pytest.mark.parametrize("two_groups", [False, True], ids=["one-group", "two-groups"])
@pytest.mark.parametrize("freeze_step", [100, 0], ids=["warm-up", "compressed"])
def test_gradients_for_different_parameters_on_different_ranks_are_refused_on_every_rank(
        freeze_step, two_groups):
    """The flat vectors are averaged by position: rank 0's gradient of parameter 0 would
    be averaged with rank 1's of parameter 1 (the same size), silently. The ranks' masks
    of which parameters have a gradient travel with the warm-up's all-reduce (and once at
    the first compressed step): every rank refuses, naming the parameter. Across two
    param groups, a rank with no gradient in a group skipped its all-reduce, pairing
    rank 0's group 0 with rank 1's group 1; now every group's mask travels."""
    with World(2, timeout=20.0, run_timeout=60.0) as w:
        with pytest.raises(RankFailedError) as info:
            w.run(_gradients_for_other_parameters, freeze_step, two_groups)
    assert sorted(info.value.failures) == [0, 1]
    for exc_type, text in info.value.failures.values():
        if two_groups and freeze_step > 0:   # each group's mask travels: sizes differ
            assert exc_type == "CollectiveMismatchError"
            continue
        assert exc_type == "ValueError"
        assert re.search(r"parameters \[[\d, ]+\] of param group \d .*on some ranks and not "
                         r"on others", text, re.S)


def test_a_compressed_step_sends_what_calc_diloco_counts(world):
    """One compressed all-reduce of the flat momentum: calc's 2(N-1)/N * M/32 bytes of
    signs (M the float32 bytes, so one bit a number; here padded to n') plus the workers'
    and the servers' scales, and calc's 4(N-1) messages (an all-to-all, three all-gathers),
    for two parameters as for one."""
    from minidist.calc.diloco import diloco_costs
    from minidist.parallel.data.onebit import padded_size
    N, n, steps = world.world_size, 64 * 64, 2
    # the steps after the first (which also checks the ranks' masks, once)
    first = world.run(run_onebit, 0, [(32, 64), (32, 64)], 1, 0)[0]
    runs = world.run(run_onebit, 0, [(32, 64), (32, 64)], 1 + steps, 0)[0]    # one vector
    got = {k: runs[k] - first[k] for k in ("sent", "msgs")}
    onebit = diloco_costs(4 * n, N, 1, 1, 32, 0.0, bandwidth=1.0)[5]
    scales = 2 * (N - 1) * 8                           # float64 s_i and t_j, all-gathered
    signs = onebit.bytes_per_step * padded_size(n, N) / n
    assert got["sent"] == pytest.approx(steps * (signs + scales), abs=1e-6)
    latency_only = diloco_costs(4 * n, N, 1, 1, 32, 0.0, bandwidth=float("inf"), latency=1.0)[5]
    assert got["msgs"] == steps * latency_only.exposed_seconds


def test_a_param_group_of_two_dtypes_is_refused():
    """One flat vector holds one dtype; the message names the fix."""
    from minidist import backend
    from minidist.parallel.data.onebit_layout import flatten
    mixed = [backend.from_host(np.ones(3, dtype=np.float32)), backend.from_host(np.ones(2))]
    with pytest.raises(ValueError, match="param group of their own"):
        flatten(mixed)


def run_resumed(seed, shapes, steps, freeze_step, stop, directory):
    """Like ``run_onebit``, but after ``stop`` steps each rank saves a checkpoint of its
    own (the error feedback is this rank's), and a new model and optimizer load it and
    take the remaining steps: the parameters after the last step."""
    from minidist import backend, nn
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.checkpoint import load_checkpoint, save_checkpoint
    from minidist.parallel.data.onebit_adam import OnebitAdam

    class Weights(nn.Module):
        def __init__(self, arrays):
            super().__init__()
            for i, a in enumerate(arrays):
                setattr(self, f"w{i}", nn.Parameter(Tensor(backend.from_host(a))))

    rank = dist.get_rank()
    path = f"{directory}/rank{rank}.ckpt"
    model = Weights([w + rank for w in start(seed, shapes)])
    opt = OnebitAdam(model.parameters(), freeze_step=freeze_step, **HYPER)
    for step in range(steps):
        if step == stop:
            save_checkpoint(path, model, opt, rank0_only=False)
            model = Weights([np.zeros(s) for s in shapes])
            opt = OnebitAdam(model.parameters(), freeze_step=freeze_step, **HYPER)
            load_checkpoint(path, model, opt)
        for p, g in zip(model.parameters(), grad(seed, step, rank, shapes)):
            p.grad = backend.from_host(g)
        opt.step()
    return [backend.to_host(p.data).copy() for p in model.parameters()]


@pytest.mark.parametrize("stop", [1, 4], ids=["saved-in-warm-up", "saved-compressed"])
def test_a_run_resumed_from_a_checkpoint_takes_the_uninterrupted_runs_steps(
        world, tmp_path, stop):
    """The step count (when the variance freezes) and both error-feedback buffers are
    in the optimizer's state dict: a run saved and loaded mid-way ends on the same bits
    as the run that never stopped."""
    shapes, steps, freeze_step = [(3, 5), (4,)], 7, 2
    whole = [r["params"][-1] for r in world.run(run_onebit, 0, shapes, steps, freeze_step)]
    resumed = world.run(run_resumed, 0, shapes, steps, freeze_step, stop, str(tmp_path))
    for want, got in zip(whole, resumed):
        for w, g in zip(want, got):
            assert np.array_equal(w, g)


def run_scaled(seed, shapes, steps, freeze_step, inf_at):
    """run_onebit under a GradScaler (each gradient times the scale, as a scaled loss
    gives: powers of two, exact), with an inf in rank 1's gradient alone at iteration
    ``inf_at`` (None: nowhere), after which the batches go on where they left off."""
    from minidist import backend
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.parallel.data.onebit_adam import OnebitAdam
    from minidist.precision import GradScaler
    rank = dist.get_rank()
    params = [Tensor(backend.from_host(w + rank), requires_grad=True)
              for w in start(seed, shapes)]
    opt = OnebitAdam(params, freeze_step=freeze_step, **HYPER)
    scaler = GradScaler(init_scale=4.0, growth_interval=1000)
    out = []
    for step in range(steps):
        batch = step if inf_at is None or step <= inf_at else step - 1
        for p, g in zip(params, grad(seed, batch, rank, shapes)):
            g = g * scaler.get_scale()
            if step == inf_at and rank == 1:
                g.reshape(-1)[0] = np.inf
            p.grad = backend.from_host(g)
        scaler.step(opt)
        scaler.update()
        out.append([backend.to_host(p.data).copy() for p in params])
    return out


@pytest.mark.parametrize("freeze_step", [5, 1], ids=["inf-in-warm-up", "inf-compressed"])
def test_an_inf_on_one_rank_alone_skips_the_step_on_every_rank(world, freeze_step):
    """No DDP averages 1-bit Adam's gradients, so GradScaler's flag must be combined over
    the ranks (combine_found_inf): the run with an inf on rank 1 at step 2 equals the
    run without it, that step repeated as a skip. Without the combining, rank 1 alone
    skipped and its next all-reduce met the others' current one."""
    shapes = [(3, 2), (4,)]
    clean = world.run(run_scaled, 3, shapes, 5, freeze_step, None)
    hit = world.run(run_scaled, 3, shapes, 6, freeze_step, 2)
    for rank in range(world.world_size):
        got = hit[rank][:2] + hit[rank][3:]              # step 2 skipped: parameters kept
        for a, b in zip(hit[rank][2], hit[rank][1]):
            assert np.array_equal(a, b)
        assert all(np.array_equal(x, y) for g, w in zip(got, clean[rank]) for x, y in zip(g, w))


def assert_every_rank_refuses(want, fn, *args):
    """``fn(*args)`` in a world of 2 with a 5 s timeout: both ranks raise a ValueError
    matching ``want`` (no rank left waiting for the other) that names the fix."""
    with World(2, timeout=5.0, run_timeout=60.0) as w:
        with pytest.raises(RankFailedError) as info:
            w.run(fn, *args)
    assert sorted(info.value.failures) == [0, 1]
    for exc_type, text in info.value.failures.values():
        assert exc_type == "ValueError", text
        assert re.search(want, text, re.S), text
        assert "zero_grad(set_to_none=False)" in text


def _change_gradients_on_one_rank(change):
    """Two compressed steps; at the second, rank 1 alone drops parameter 1's gradient
    ("drop") or gives parameter 2, which had none at the first, one ("add")."""
    from minidist import backend
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.parallel.data.onebit_adam import OnebitAdam
    params = [Tensor(backend.from_host(np.ones(4 + i)), requires_grad=True) for i in range(3)]
    opt = OnebitAdam(params, freeze_step=0)
    for step in range(2):
        for i, p in enumerate(params):
            p.grad = backend.from_host(np.ones(4 + i)) if i < 2 else None
        if step == 1 and dist.get_rank() == 1:
            if change == "drop":
                params[1].grad = None
            else:
                params[2].grad = backend.from_host(np.ones(6))
        opt.step()


@pytest.mark.parametrize("change", ["drop", "add"])
def test_a_gradient_set_changed_on_one_rank_is_refused_on_every_rank_naming_it(change):
    """The rank whose gradients changed refuses the compressed all-reduce (a negative
    scale where its scale would go, no message more); its peer learns it from the
    gathered scales instead of waiting out the timeout (5 s here), and both name the
    parameter and the rank."""
    want = (r"parameter 1 \(shape \(5,\)\) has no gradient on rank\(s\) \[1\]"
            if change == "drop" else r"parameter 2 \(shape \(6,\)\) has a gradient on "
                                     r"rank\(s\) \[1\]")
    assert_every_rank_refuses(want, _change_gradients_on_one_rank, change)


def _gradient_for_a_group_that_had_none(others):
    """Two compressed steps; param group 1's parameter (shape (6,)) has no gradient on
    any rank at the first, and rank 1 alone gives it one at the second. ``others``:
    "travel" (group 0's parameter has a gradient on both ranks at both steps) or
    "nothing" (it has none either: no compressed all-reduce at all)."""
    from minidist import backend
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.parallel.data.onebit_adam import OnebitAdam
    params = [Tensor(backend.from_host(np.ones(4 + 2 * i)), requires_grad=True)
              for i in range(2)]
    opt = OnebitAdam([{"params": [p]} for p in params], freeze_step=0)
    for step in range(2):
        params[0].grad = backend.from_host(np.ones(4)) if others == "travel" else None
        params[1].grad = None
        if step == 1 and dist.get_rank() == 1:
            params[1].grad = backend.from_host(np.ones(6))
        opt.step()


@pytest.mark.parametrize("others", ["travel", "nothing"])
def test_a_gradient_in_a_group_laid_out_over_nothing_is_refused_on_every_rank(others):
    """A param group with no gradient on any rank at its first compressed step makes no
    collective, so rank 1 alone raised when it gave it a gradient, and rank 0 waited
    for it at its next all-reduce (5 s here) or went on without it. The check is over
    the whole optimizer: rank 1 refuses group 0's compressed all-reduce, and both name
    the parameter; with no compressed all-reduce at all, the masks are agreed on at
    every step until some group has a gradient, so both refuse it there."""
    want = (r"param group 1, parameter 0 \(shape \(6,\)\) has a gradient on rank\(s\) \[1\]"
            if others == "travel" else
            r"parameters \[0\] of param group 1 .*on some ranks and not on others")
    assert_every_rank_refuses(want, _gradient_for_a_group_that_had_none, others)


def test_steps_with_no_gradient_anywhere_leave_the_layout_to_the_first_with_one(world):
    """While no parameter has a gradient on any rank, nothing is laid out (every step
    agrees on the masks again), so a run whose first compressed steps have no gradient
    at all is the algorithm from the first step that has one, on the same bits."""
    shapes = [(3, 4), (5,)]
    got = world.run(run_onebit, 7, shapes, 3, 0, empty_steps=2)
    want = simulate(7, shapes, 3, 0, world.world_size)
    for rank_steps in got:
        for g_step, w_step in zip(rank_steps["params"], want):
            for g, w in zip(g_step, w_step):
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


def _gradient_after_resume_for_a_group_that_had_none(directory):
    """A compressed step with a gradient in param group 0 alone, a checkpoint per rank,
    a new model and optimizer that load it, and a step with gradients in both groups,
    on every rank."""
    from minidist import backend, nn
    from minidist.autograd import Tensor
    import minidist.distributed as dist
    from minidist.checkpoint import load_checkpoint, save_checkpoint
    from minidist.parallel.data.onebit_adam import OnebitAdam

    def model_and_optimizer():
        model = nn.Module()
        model.a = nn.Parameter(Tensor(backend.from_host(np.ones(4))))
        model.b = nn.Parameter(Tensor(backend.from_host(np.ones(6))))
        return model, OnebitAdam([{"params": [model.a]}, {"params": [model.b]}], freeze_step=0)

    path = f"{directory}/rank{dist.get_rank()}.ckpt"
    model, opt = model_and_optimizer()
    model.a.grad = backend.from_host(np.ones(4))
    opt.step()
    save_checkpoint(path, model, opt, rank0_only=False)
    model, opt = model_and_optimizer()
    load_checkpoint(path, model, opt)
    model.a.grad, model.b.grad = backend.from_host(np.ones(4)), backend.from_host(np.ones(6))
    opt.step()


def test_a_resumed_run_keeps_the_groups_laid_out_over_nothing(tmp_path):
    """The uninterrupted run refuses a gradient that comes to a group laid out over no
    parameter, even on every rank; the state dict keeps those groups ('empty'), so the
    resumed run refuses it too instead of laying the group out afresh."""
    want = r"param group 1, parameter 0 \(shape \(6,\)\) has a gradient on rank\(s\) \[0, 1\]"
    assert_every_rank_refuses(want, _gradient_after_resume_for_a_group_that_had_none,
                              str(tmp_path))
