"""Clipping a tensor- or pipeline-parallel GPT or Llama equals clipping it in one process.

One 2-rank world for the module (the tensor-parallel group, then the pipeline
group). The parent runs the dense GPT on the same batch, takes
``optim.clip_grad_norm_`` of it with a max_norm below the norm (so clipping
happens), and sends the clipped gradients; every rank clips its own with
``parallel.clip_grad_norm_`` and compares them with its slice of the parent's.
float64; the norm agrees to 1e-12 relative, the gradients to 1e-12.

The same ranks also report what a rank would get alone (its own parameters'
norm) and what summing those over the ranks gives: neither is the model's norm,
since a rank lacks the others' parameters and replicated or tied ones would be
counted twice. So counting each parameter once is what makes the test pass.
The 3D case (dp = pp = tp = 2) is in test_3d.py, next to its 8-rank world.
"""
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.comm import World
from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
from minidist.optim import clip_grad_norm_ as clip_one_process
from minidist.optim import grad_sq_sum
from minidist.parallel import (TensorParallelGPT, TensorParallelLlama, clip_grad_norm_, pieces_of_rank,
                               pipeline_parameters, run_pipeline, shard_state_dict, split_gpt,
                               sync_tied_gradients)
from minidist.parallel.pipeline.schedule import make_schedule

TOL = 1e-12
M = 2   # pipeline micro-batches


@pytest.fixture(scope="module")
def world():
    w = World(2, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


def _config(case):
    if case["model"] == "llama":   # grouped-query heads: two query heads per kv head
        return LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=12,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=4, tie_word_embeddings=case["tie"],
                           dtype="float64", seed=case["seed"])
    return GPTConfig(block_size=4, vocab_size=12, n_layer=2, n_head=2, n_embd=8,
                     tie_weights=case["tie"], dtype="float64", seed=case["seed"])


def _dense(case):
    return (Llama if case["model"] == "llama" else GPT)(_config(case))


def _batch(case, cfg):
    rng = np.random.default_rng(case["seed"])
    shape = (2 * M, 4)
    return rng.integers(0, cfg.vocab_size, shape), rng.integers(0, cfg.vocab_size, shape)


def dense_clipped(case):
    """The oracle: one process, the whole batch -> (norm before clipping, max_norm,
    clipped gradients by name)."""
    cfg = _config(case)
    model = _dense(case)
    idx, tgt = _batch(case, cfg)
    _, loss = model(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    norm = clip_one_process(model.parameters(), math.inf, case["p"])    # measure only
    max_norm = case["fraction"] * norm
    clipped = clip_one_process(model.parameters(), max_norm, case["p"])
    assert clipped == norm
    return norm, max_norm, {n: backend.to_host(q.grad) for n, q in model.named_parameters()}


def _max_err(named: dict, want: dict) -> float:
    return max(float(np.abs(backend.to_host(q.grad) - backend.to_host(want[n])).max())
               for n, q in named.items())


def tensor_parallel_clip(case, max_norm, want):
    """Every rank: the tensor-parallel model's step gradients, clipped -> (norm, own sq sum,
    err)."""
    cfg = _config(case)
    parallel = TensorParallelLlama if case["model"] == "llama" else TensorParallelGPT
    model = parallel(cfg, None, case["sp"])
    idx, tgt = _batch(case, cfg)
    _, loss = model(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    own = grad_sq_sum(model.parameters())
    norm = clip_grad_norm_(model, max_norm, norm_type=case["p"])
    shards = shard_state_dict(model, {n: backend.from_host(a) for n, a in want.items()})
    return norm, own, _max_err(dict(model.named_parameters()), shards)


def pipeline_clip(case, max_norm, want):
    """Every rank: its pipeline stage's gradients (1F1B), clipped -> (norm, own sq sum, err)."""
    p, r = dist.get_world_size(), dist.get_rank()
    cfg = _config(case)
    model = _dense(case)
    chunks = pieces_of_rank(split_gpt(model, p), r, p)
    idx, tgt = (np.split(a, M) for a in _batch(case, cfg))
    run_pipeline(make_schedule("1f1b", p, M)[r], chunks, M,
                 [backend.from_host(a) for a in idx], [backend.from_host(a) for a in tgt],
                 activation_shape=(2, 4, 8), dtype="float64")
    sync_tied_gradients(model, chunks)
    mine = pipeline_parameters(chunks)
    own = grad_sq_sum(mine)
    norm = clip_grad_norm_(model, max_norm, chunks, norm_type=case["p"])
    ids = {id(q) for q in mine}
    named = {n: q for n, q in model.named_parameters() if id(q) in ids}
    return norm, own, _max_err(named, {n: backend.from_host(a) for n, a in want.items()})


def _check(results, norm, case):
    for got, own, err in results:
        assert abs(got - norm) <= TOL * norm, (case, got, norm)
        assert err <= TOL, (case, err)
        if case["p"] == 2.0:   # what a rank sees alone is not the model's norm
            assert math.sqrt(own) < norm * (1 - 1e-9), (case, own, norm)
    return math.sqrt(sum(own for _, own, _ in results))


cases = st.fixed_dictionaries(dict(
    model=st.sampled_from(["gpt", "llama"]), seed=st.integers(0, 2**16), tie=st.booleans(), sp=st.booleans(),
    p=st.sampled_from([2.0, 1.0, math.inf]), fraction=st.sampled_from([0.05, 0.5, 0.9])))


@settings(max_examples=6, deadline=None)
@given(case=cases)
@example(case=dict(model="llama", seed=1, tie=False, sp=False, p=2.0, fraction=0.5))
def test_tensor_parallel_clip_equals_single_process_clip(world, case):
    norm, max_norm, want = dense_clipped(case)
    summed = _check(world.run(tensor_parallel_clip, case, max_norm, want), norm, case)
    if case["p"] == 2.0:   # replicated layer norms, biases, wpe would count twice
        assert summed > norm * (1 + 1e-6), (case, summed, norm)


@settings(max_examples=6, deadline=None)
@given(case=cases)
def test_pipeline_clip_equals_single_process_clip(world, case):
    norm, max_norm, want = dense_clipped(case)
    summed = _check(world.run(pipeline_clip, case, max_norm, want), norm, case)
    if case["p"] == 2.0 and case["tie"]:   # the tied embedding would count twice
        assert summed > norm * (1 + 1e-6), (case, summed, norm)
