"""ZeRO-3 under autocast, FP8 and block scaling trains as ZeRO-1/2 (and one process) do.

ZeRO-3 runs each unit's forward without a graph and recomputes it in backward,
after the ``with autocast(...)`` block has closed; the recompute re-enters the
policy captured at forward time (autograd/recompute.py). Every rank sees the same
micro-batches in every strategy and a sum of two ranks' gradients does not
depend on its order, so the parameters after k steps are the same bits as
ZeRO-1's and ZeRO-2's (and, in a world of one, as plain training's). Micro-batches
are accumulated only in the world of one: across ranks ZeRO-3 reduce-scatters
each micro-batch's gradient where ZeRO-1 reduces their sum, a reordered sum
(test_zero.py bounds it); the sums agree with one micro-batch per step. An FP8
recipe's sites, scales and amax histories after the steps equal a plain step's.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World

POLICIES = ["bf16", "fp16", "fp8", "mxfp8"]


def _train(case):
    import minidist
    import minidist.distributed as dist
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.nn import MLP
    from minidist.optim import AdamW
    from minidist.parallel import Zero1, Zero2, Zero3
    from minidist.precision import (BlockScaling, DelayedScaling, autocast, block_autocast,
                                    fp8_autocast)
    strategy, policy, b = case["strategy"], case["policy"], case["batch"]
    rank = dist.get_rank() if strategy != "single" else 0
    n = dist.get_world_size() if strategy != "single" else 1
    minidist.manual_seed(case["seed"])
    model = MLP(case["width"], case["hidden"], generator=backend.Generator(case["seed"]))
    recipe = None
    if policy in ("bf16", "fp16"):
        def enter():
            return autocast(policy)
    elif policy == "fp8":
        recipe = DelayedScaling(amax_history_len=3)

        def enter():
            return fp8_autocast(recipe)
    else:
        recipe = BlockScaling(policy)

        def enter():
            return block_autocast(recipe)
    if strategy == "single":
        wrapped, opt = model, AdamW(model.parameters(), lr=0.01)
    elif strategy == "zero3":
        wrapped, opt = Zero3(model, AdamW, prefetch=case["prefetch"], lr=0.01), None
    else:
        wrapped = (Zero1 if strategy == "zero1" else Zero2)(model, AdamW, lr=0.01)
        opt = None
    rng = np.random.default_rng(case["seed"])
    shape = (case["steps"], case["micro"], n * b, case["width"])
    x, y = (rng.standard_normal(shape).astype("float32") for _ in range(2))
    for s in range(case["steps"]):
        for j in range(case["micro"]):
            with enter():
                out = wrapped(Tensor(backend.from_host(x[s, j, rank * b:(rank + 1) * b])))
            d = out - Tensor(backend.from_host(y[s, j, rank * b:(rank + 1) * b]))
            (d * d).mean().backward()
        (opt or wrapped).step()
        (opt or wrapped).zero_grad()
    if strategy in ("single", "zero1", "zero2"):
        params = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    else:
        params = {k: backend.to_host(v).copy() for k, v in wrapped.full_state_dict().items()}
    state = None
    if isinstance(recipe, DelayedScaling):
        state = [(backend.to_host(s.scale).copy(), backend.to_host(s.amax_history).copy())
                 for site in recipe.sites for s in site["inputs"] + [site["grad"]]]
    return params, state


def _same(a, b, what):
    params_a, state_a = a
    params_b, state_b = b
    assert params_a.keys() == params_b.keys()
    for k in params_a:
        assert np.array_equal(params_a[k], params_b[k]), \
            f"{what}: {k} differs by {np.abs(params_a[k] - params_b[k]).max():.3e}"
    if state_a is not None:   # FP8: the same sites, scales and amax histories
        assert len(state_a) == len(state_b), f"{what}: {len(state_a)} vs {len(state_b)} sites"
        for i, ((s1, h1), (s2, h2)) in enumerate(zip(state_a, state_b)):
            assert np.array_equal(s1, s2) and np.array_equal(h1, h2), f"{what}: fp8 state {i}"


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=2, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(2, 9), hidden=st.integers(2, 12),
       batch=st.integers(1, 5), micro=st.integers(1, 2), prefetch=st.booleans())
def test_zero3_under_a_precision_policy_equals_zero1_zero2_and_one_process(
        world, policy, seed, width, hidden, batch, micro, prefetch):
    micro = micro if world.world_size == 1 else 1    # where the sums agree (docstring)
    case = dict(policy=policy, seed=seed, width=width, hidden=hidden, batch=batch, micro=micro,
                steps=2, prefetch=prefetch)
    zero3 = world.run(_train, dict(case, strategy="zero3"))
    for stage in ("zero1", "zero2"):
        other = world.run(_train, dict(case, strategy=stage))
        for rank in range(world.world_size):
            _same(zero3[rank], other[rank], f"zero3 vs {stage}, rank {rank}, {case}")
    if world.world_size == 1:
        _same(zero3[0], _train(dict(case, strategy="single")), f"zero3 vs one process, {case}")
