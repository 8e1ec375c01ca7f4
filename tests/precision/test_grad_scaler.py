"""GradScaler follows torch.amp.GradScaler step for step: same scale trajectory,
same skipped steps; a skipped step leaves the weights bit for bit unchanged."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import Tensor, backend
from minidist.optim import SGD
from minidist.precision import GradScaler
from oracles.optional import require

W0 = np.array([0.5, -1.25, 3.0], dtype=np.float32)
G = np.array([1e-3, -2e-4, 5e-5], dtype=np.float32)


def run_minidist(pattern, **kw):
    p = Tensor(W0.copy(), requires_grad=True)
    opt = SGD([p], lr=0.1)
    scaler = GradScaler(**kw)
    scales, changed = [], []
    for overflow in pattern:
        before = backend.to_host(p.data).copy()
        g = G * np.float32(scaler.get_scale())            # what backward of S * loss gives
        if overflow:
            g = g.copy()
            g[1] = np.inf if overflow == 1 else np.nan
        p.grad = backend.from_host(g)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        changed.append(not np.array_equal(backend.to_host(p.data), before))
    return scales, changed


def run_torch(pattern, **kw):
    torch = require("torch")
    p = torch.nn.Parameter(torch.tensor(W0))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **kw)
    scales, changed = [], []
    for overflow in pattern:
        before = p.detach().clone()
        scaler.scale(torch.tensor(1.0))                   # torch makes its scale lazily here
        g = torch.tensor(G) * torch.tensor(np.float32(scaler.get_scale()))
        if overflow:
            g[1] = float("inf") if overflow == 1 else float("nan")
        p.grad = g
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        changed.append(not torch.equal(p.detach(), before))
    return scales, changed


@settings(max_examples=25)
@given(pattern=st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=1, max_size=40),
       growth_interval=st.integers(1, 4),
       factors=st.sampled_from([(2.0, 0.5), (1.7, 0.3), (3.0, 0.9)]),
       init_scale=st.sampled_from([2.0 ** 16, 1.0, 3.3e38, 1e-30]))
def test_scale_trajectory_and_skips_match_torch(pattern, growth_interval, factors, init_scale):
    kw = dict(init_scale=init_scale, growth_factor=factors[0], backoff_factor=factors[1],
              growth_interval=growth_interval)
    ours, theirs = run_minidist(pattern, **kw), run_torch(pattern, **kw)
    assert ours == theirs


def test_trace_of_the_worked_example():
    # scale 2^16; steps: clean, overflow, clean, overflow, clean -> 2^14, 2 skipped
    scales, changed = run_minidist([0, 1, 0, 1, 0])
    assert scales == [65536.0, 32768.0, 32768.0, 16384.0, 16384.0]
    assert changed == [True, False, True, False, True]


def test_growth_stops_at_the_largest_finite_scale():
    scales, _ = run_minidist([0, 0, 0], init_scale=2.0 ** 127, growth_interval=1)
    assert scales == [2.0 ** 127] * 3


def test_unscale_then_step_unscales_once():
    p = Tensor(W0.copy(), requires_grad=True)
    opt = SGD([p], lr=1.0)
    scaler = GradScaler(init_scale=4.0)
    p.grad = backend.from_host(G * 4)
    scaler.unscale_(opt)
    assert np.array_equal(backend.to_host(p.grad), G)
    scaler.step(opt)
    assert np.array_equal(backend.to_host(p.data), W0 - G)


def test_a_skipped_step_runs_the_step_skipped_hooks_and_not_the_post_hooks():
    """What a wrapper counting iterations (DiLoCo) sees: one call per scaler.step()."""
    p = Tensor(W0.copy(), requires_grad=True)
    opt = SGD([p], lr=1.0)
    seen = []
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("stepped"))
    handle = opt.register_step_skipped_hook(lambda o, args, kwargs: seen.append("skipped"))
    scaler = GradScaler(init_scale=4.0)
    for grad in (G * 4, np.full_like(G, np.inf), G * 2):
        p.grad = backend.from_host(grad)
        scaler.step(opt)
        scaler.update()
    assert seen == ["stepped", "skipped", "stepped"]
    handle.remove()
    p.grad = backend.from_host(np.full_like(G, np.nan))
    scaler.step(opt)
    assert seen == ["stepped", "skipped", "stepped"]
    assert np.array_equal(backend.to_host(p.data), (W0 - G) - G)   # two steps taken


def test_misuse_is_refused():
    p = Tensor(W0.copy(), requires_grad=True)
    opt = SGD([p], lr=1.0)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    p.grad = backend.from_host(G)
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already"):
        scaler.step(opt)
    with pytest.raises(ValueError):
        GradScaler(growth_interval=0)


def test_state_dict_matches_torch_and_round_trips():
    torch = require("torch")
    ours = run_scaler_state()
    theirs = torch.amp.GradScaler("cpu").state_dict()
    assert set(ours.state_dict()) == set(theirs)
    fresh = GradScaler()
    fresh.load_state_dict(ours.state_dict())
    assert fresh.state_dict() == ours.state_dict()
    assert GradScaler(enabled=False).state_dict() == {}


def run_scaler_state() -> GradScaler:
    p = Tensor(W0.copy(), requires_grad=True)
    opt = SGD([p], lr=1.0)
    scaler = GradScaler(growth_interval=5)
    for _ in range(3):
        p.grad = backend.from_host(G)
        scaler.step(opt)
        scaler.update()
    return scaler


def test_found_inf_reduce_makes_every_rank_skip_together():
    """Two ranks, simulated one after the other: rank 1's gradient overflows, rank
    0's does not. A fake all-reduce (max of both flags) makes rank 0 skip too."""
    flags = {0: None, 1: None}

    def fake_all_reduce_max(rank):
        def reduce(found_inf):
            assert found_inf.shape == () and found_inf.dtype == np.float32
            flags[rank] = float(found_inf)
            return found_inf * 0 + 1.0      # what max over ranks returns: rank 1 found inf
        return reduce

    for rank, g in ((0, G), (1, np.array([np.inf, 0, 0], np.float32))):
        p = Tensor(W0.copy(), requires_grad=True)
        opt = SGD([p], lr=1.0)
        scaler = GradScaler(found_inf_reduce=fake_all_reduce_max(rank))
        p.grad = backend.from_host(g)
        scaler.step(opt)
        scaler.update()
        assert np.array_equal(backend.to_host(p.data), W0), f"rank {rank} stepped"
        assert scaler.get_scale() == 2.0 ** 15
    assert flags == {0: 0.0, 1: 1.0}


def test_disabled_scaler_is_a_pass_through():
    p = Tensor(W0.copy(), requires_grad=True)
    opt = SGD([p], lr=1.0)
    scaler = GradScaler(enabled=False)
    loss = Tensor(np.float32(2.0))
    assert scaler.scale(loss) is loss
    p.grad = backend.from_host(G)
    scaler.step(opt)
    scaler.update()
    assert np.array_equal(backend.to_host(p.data), W0 - G) and scaler.get_scale() == 1.0
