"""An expert-parallel GPT with MoE blocks (ep, and dp x ep) equals one process training
the same model on the same global batch: outputs, aux losses, the dropped assignments,
gradients and AdamW steps, at worlds 2, 3 and 4, with uneven expert loads and experts
that receive no token, and clip_grad_norm_ over every rank's experts. float64, within
1e-10 (sums are reordered across ranks).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.comm import RankFailedError, World
from minidist.nn import GPT, GPTConfig
from minidist.optim import AdamW, clip_grad_norm_
from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                      sync_expert_parallel_gradients)

STEPS = 2


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=120.0)
    yield w
    w.close()


def _config(case, world):
    return GPTConfig(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=8,
                     moe_every=case["every"], n_expert=case["E"], moe_top_k=case["k"],
                     capacity_factor=case["cf"], moe_groups=world, moe_aux_coef=0.1,
                     moe_z_coef=0.01, moe_bias_rate=case["bias_rate"], dtype="float64",
                     seed=case["seed"])


def _batch(case, world):
    rng = np.random.default_rng(case["seed"])
    idx = rng.integers(0, 13, (world * case["b"], case["T"]))
    if case["skew"]:  # one token everywhere: every token picks the same experts
        idx[:] = 3
    return idx, np.roll(idx, -1, axis=1)


def _train(model, opt, idx, tgt, after_backward):
    """STEPS steps; returns per step: logits, loss, per-layer (aux, kept, counts), grads."""
    record = []
    for _ in range(STEPS):
        opt.zero_grad()
        logits, loss = model(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        after_backward()
        moes = [(m.aux_loss.item(), backend.to_host(m.last.kept), backend.to_host(m.last.counts))
                for m in model.moe_layers()]
        grads = {n: backend.to_host(p.grad).copy() for n, p in model.named_parameters()}
        record.append((backend.to_host(logits.data), loss.item(), moes, grads))
        opt.step()
        model.update_moe_bias()
    params = {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}
    return record, params


def on_rank(case):
    n, r = dist.get_world_size(), dist.get_rank()
    mesh = ExpertMesh(ep=case["ep"], dp=n // case["ep"])
    model = expert_parallel(GPT(_config(case, n)), mesh)
    idx, tgt = _batch(case, n)
    b = case["b"]
    mine = slice(r * b, (r + 1) * b)
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def after_backward():
        sync_expert_parallel_gradients(model, mesh)
        _clip(model, case)
    return _train(model, opt, idx[mine], tgt[mine], after_backward)


def _clip(model, case):
    """``clip_grad_norm_(model.parameters())`` if the case clips: on a rank's experts it
    must count every rank's experts (they are pieces: optim/clip.py)."""
    if case.get("clip"):
        clip_grad_norm_(model.parameters(), case["clip"])


def single_process(case, n):
    model = GPT(_config(case, n))
    idx, tgt = _batch(case, n)
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return _train(model, opt, idx, tgt, lambda: _clip(model, case))


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_expert_parallel_gpt_matches_single_process(world, data):
    n = world.world_size
    ep = data.draw(st.sampled_from([e for e in (2, 3, 4) if n % e == 0]))
    case = dict(ep=ep, E=ep * data.draw(st.integers(1, 2)), k=data.draw(st.integers(1, 2)),
                cf=data.draw(st.sampled_from([0.0, 0.5, 1.25])), every=data.draw(st.integers(1, 2)),
                b=data.draw(st.integers(1, 2)), T=data.draw(st.sampled_from([3, 8])),
                skew=data.draw(st.booleans()), bias_rate=data.draw(st.sampled_from([0.0, 0.01])),
                clip=data.draw(st.sampled_from([0.05, None])), seed=data.draw(st.integers(0, 999)))
    case["k"] = min(case["k"], case["E"])
    ranks = world.run(on_rank, case)
    (want, want_params) = single_process(case, n)
    b, tol = case["b"], dict(rtol=1e-10, atol=1e-12)
    for step, (logits, loss, moes, grads) in enumerate(want):
        got_logits = np.concatenate([ranks[r][0][step][0] for r in range(n)])
        np.testing.assert_allclose(got_logits, logits, **tol, err_msg=f"logits step {step}")
        # each rank's loss is its local mean: their average is the global loss
        np.testing.assert_allclose(np.mean([ranks[r][0][step][1] for r in range(n)]), loss, **tol)
        for layer, (aux, kept, counts) in enumerate(moes):
            got_aux = np.mean([ranks[r][0][step][2][layer][0] for r in range(n)])
            np.testing.assert_allclose(got_aux, aux, **tol, err_msg=f"aux layer {layer}")
            got_kept = np.concatenate([ranks[r][0][step][2][layer][1] for r in range(n)])
            np.testing.assert_array_equal(got_kept, kept)           # the same drops
            for r in range(n):
                np.testing.assert_array_equal(ranks[r][0][step][2][layer][2], counts)
        for r in range(n):
            for name, g in ranks[r][0][step][3].items():
                np.testing.assert_allclose(g, grads[name], **tol, err_msg=f"{name} rank {r}")
    for r in range(n):
        for name, p in ranks[r][1].items():
            np.testing.assert_allclose(p, want_params[name], **tol, err_msg=f"{name} rank {r}")


def _experts_that_do_not_split():
    mesh = ExpertMesh(ep=dist.get_world_size())
    cfg = GPTConfig(n_layer=1, n_embd=8, n_head=2, moe_every=1,
                    n_expert=dist.get_world_size() + 1)
    expert_parallel(GPT(cfg), mesh)


def test_experts_that_do_not_split_over_the_group_are_an_error(world):
    with pytest.raises(RankFailedError, match="experts do not split over an expert-parallel"):
        world.run(_experts_that_do_not_split)
