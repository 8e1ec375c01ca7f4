"""Warmup + cosine, the scheduler objects, and the batch-size scaling rules."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.optim import (SGD, AdamW, LambdaLR, WarmupCosine, linear_scaled_lr,
                            sqrt_scaled_lr, warmup_cosine, warmup_steps_for)
from optim_helpers import PROPERTY, host, make_params, make_problem, set_grads

schedule_args = st.tuples(st.integers(0, 50), st.integers(0, 200)).map(
    lambda wt: (wt[0], wt[0] + wt[1]))           # (warmup_steps, total_steps), W <= T


def test_warmup_starts_near_zero_and_reaches_base_lr():
    assert warmup_cosine(0, 1.0, warmup_steps=100, total_steps=1000) == 0.01
    assert warmup_cosine(99, 1.0, warmup_steps=100, total_steps=1000) == 1.0
    assert warmup_cosine(100, 1.0, warmup_steps=100, total_steps=1000) == 1.0


def test_cosine_passes_the_midpoint_and_lands_on_min_lr():
    base, low = 3e-4, 3e-5
    assert math.isclose(warmup_cosine(550, base, 100, 1000, min_lr=low), (base + low) / 2)
    assert warmup_cosine(1000, base, 100, 1000, min_lr=low) == low
    assert warmup_cosine(5000, base, 100, 1000, min_lr=low) == low     # stays there


@PROPERTY
@given(wt=schedule_args, base=st.floats(1e-5, 1.0), low_fraction=st.floats(0.0, 1.0))
def test_warmup_rises_then_cosine_never_rises(wt, base, low_fraction):
    warmup, total = wt
    low = base * low_fraction
    lrs = [warmup_cosine(s, base, warmup, total, low) for s in range(total + 5)]
    assert all(a < b for a, b in zip(lrs[:warmup], lrs[1:warmup]))
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1:]))
    assert all(0 < lr <= base for lr in lrs[:warmup])        # warmup may start below min_lr
    # (within a rounding: min + (base - min) can land one ulp off base)
    assert all(low * (1 - 1e-12) <= lr <= base * (1 + 1e-12) for lr in lrs[warmup:])


def test_workbook_scaling_rules():
    # Base lr 3e-4 at batch 256, scaled to batch 2048 (k = 8).
    assert math.isclose(linear_scaled_lr(3e-4, 256, 2048), 2.4e-3)
    assert math.isclose(sqrt_scaled_lr(3e-4, 256, 2048), 8.485e-4, rel_tol=1e-3)   # ~8.49e-4
    assert warmup_steps_for(256, 2048) == 8000


def test_scaling_rules_are_the_identity_at_the_same_batch():
    assert linear_scaled_lr(0.1, 64, 64) == 0.1
    assert sqrt_scaled_lr(0.1, 64, 64) == 0.1
    assert warmup_steps_for(64, 64) == 1000


@pytest.mark.parametrize("call", [
    lambda: warmup_cosine(-1, 1.0, 10, 100),
    lambda: warmup_cosine(0, 1.0, 10, 5),
    lambda: warmup_cosine(0, 1.0, 10, 100, min_lr=2.0),
    lambda: linear_scaled_lr(0.1, 0, 256),
    lambda: sqrt_scaled_lr(0.1, 256, -1),
    lambda: warmup_steps_for(0, 256)])
def test_bad_schedule_arguments_raise(call):
    with pytest.raises(ValueError):
        call()


def test_lambda_lr_matches_torch_driving_sgd(torch):
    weights, grads = make_problem([(3, 2), (4,)], 8, seed=3)
    lam = lambda s: 0.5 ** s                     # noqa: E731 (a schedule is a lambda, as in torch)
    params = make_params(weights)
    opt = SGD(params, lr=0.3, momentum=0.9)
    sched = LambdaLR(opt, lam)
    theirs = [torch.tensor(w.copy(), requires_grad=True) for w in weights]
    topt = torch.optim.SGD(theirs, lr=0.3, momentum=0.9)
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, lam)
    for round_ in grads:
        set_grads(params, round_)
        for p, g in zip(theirs, round_):
            p.grad = torch.tensor(g)
        opt.step()
        topt.step()
        sched.step()
        tsched.step()
        assert sched.get_last_lr() == tsched.get_last_lr()
    for a, p in zip(host(params), theirs):
        np.testing.assert_allclose(a, p.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_warmup_cosine_scheduler_sets_each_groups_lr():
    a, b = make_params([np.zeros(2), np.zeros(2)])
    opt = AdamW([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 0.1}])
    sched = WarmupCosine(opt, warmup_steps=4, total_steps=10)
    seen = [sched.get_last_lr()]
    for _ in range(10):
        sched.step()
        seen.append(sched.get_last_lr())
    assert seen[0] == [0.25, 0.025]               # applied on construction: step 0
    assert seen[3] == [1.0, 0.1]                  # end of warmup
    assert seen[10] == [0.0, 0.0]                 # min_lr at total_steps
    assert [g["initial_lr"] for g in opt.param_groups] == [1.0, 0.1]


def test_scheduler_state_dict_round_trip_resumes_the_schedule():
    opt = SGD(make_params([np.zeros(2)]), lr=1.0)
    sched = WarmupCosine(opt, 3, 20)
    for _ in range(7):
        sched.step()
    saved = sched.state_dict()
    fresh_opt = SGD(make_params([np.zeros(2)]), lr=1.0)
    fresh = WarmupCosine(fresh_opt, 3, 20)
    fresh.load_state_dict(saved)
    sched.step()
    fresh.step()
    assert fresh.get_last_lr() == sched.get_last_lr() == [warmup_cosine(8, 1.0, 3, 20)]


def test_lambda_lr_needs_one_lambda_per_group():
    a, b = make_params([np.zeros(1), np.zeros(1)])
    opt = SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    with pytest.raises(ValueError, match="2 param groups"):
        LambdaLR(opt, [lambda s: 1.0])


def _schedule_a_zero_wrapper(name):
    from minidist.nn import MLP
    from minidist.optim import AdamW, LambdaLR, WarmupCosine
    from minidist.parallel import Zero1
    zero = Zero1(MLP(2, 3), AdamW, lr=0.1)
    make = {"WarmupCosine": lambda o: WarmupCosine(o, 2, 10),
            "LambdaLR": lambda o: LambdaLR(o, lambda step: 1.0)}[name]
    wanted = r"got Zero1: pass its optimizer \(Zero1\(\.\.\.\)\.optimizer"
    with pytest.raises(TypeError, match=wanted):
        make(zero)
    make(zero.optimizer)                # the optimizer that steps the shards: accepted
    return zero.optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("name", ["WarmupCosine", "LambdaLR"])
def test_a_scheduler_given_a_zero_wrapper_says_to_pass_its_optimizer(name):
    from minidist.comm import World
    with World(1, timeout=20.0, run_timeout=60.0) as w:
        assert w.run(_schedule_a_zero_wrapper, name)[0] <= 0.1   # the warm-up, or 1.0 x 0.1
