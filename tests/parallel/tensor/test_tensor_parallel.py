"""Tensor-parallel layers equal the dense layers they split, forward and backward.

Worlds of 1..4 ranks (the tensor-parallel group is the world) stay up for the
module while hypothesis sends cases: sizes, seeds, bias, sequence parallelism.
Every rank builds the dense layer from the seed, loads its shard of the dense
weights (``shard_state_dict``), runs both on the same input and upstream
gradient, and returns the largest difference of outputs and gradients (its
shard against the matching slice of the dense result). float64; tolerance 1e-12:
a row-parallel sum is the dense sum in a different order.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.comm import World
from minidist.nn import GPT, MLP, CausalSelfAttention, GPTConfig, Linear
from minidist.optim import clip_grad_norm_
from minidist.parallel import (ColumnParallelLinear, ParallelMLP, ParallelSelfAttention,
                               RowParallelLinear, TensorParallelGPT, shard_state_dict,
                               vocab_parallel_cross_entropy)

TOL = 1e-12


class Restarting:
    """A world kept up for the module, started again if a failing case brought it
    down (so hypothesis can replay the failure and report it, not 'world closed')."""

    def __init__(self, n: int):
        self.world_size, self.world = n, World(n, timeout=20.0, run_timeout=90.0)

    def run(self, fn, *args):
        if self.world.closed:
            self.world = World(self.world_size, timeout=20.0, run_timeout=90.0)
        return self.world.run(fn, *args)


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"tp{n}")
def world(request):
    w = Restarting(request.param)
    yield w
    w.world.close()


def _split(a, axis, t, r):
    return np.ascontiguousarray(np.split(a, t, axis=axis)[r])


def _err(tp_grads: dict, dense_grads: dict) -> float:
    return max(float(np.abs(backend.to_host(tp_grads[n]) - backend.to_host(dense_grads[n])).max())
               for n in tp_grads)


def layer_case(case):
    """Runs on every rank: dense vs tensor-parallel layer of ``case['kind']``."""
    t, r = dist.get_world_size(), dist.get_rank()
    kind, sp, bias = case["kind"], case.get("sp", False), case["bias"]
    C, B, T = case["width"] * t, case["batch"], case["length"] * t
    rng = np.random.default_rng(case["seed"])
    gen = backend.Generator(case["seed"])
    kw = dict(dtype="float64", sequence_parallel=sp)
    if kind == "column":
        dense = Linear(C, 2 * C, bias, "float64", generator=gen)
        tp = ColumnParallelLinear(C, 2 * C, bias, gather_output=case["gather"], **kw)
    elif kind == "row":
        dense = Linear(2 * C, C, bias, "float64", generator=gen)
        tp = RowParallelLinear(2 * C, C, bias, **kw)
    elif kind == "mlp":
        dense = MLP(C, 4 * C, 0.0, bias, "float64", generator=gen)
        tp = ParallelMLP(C, 4 * C, 0.0, bias, **kw)
    else:
        heads = case["heads_per_rank"] * t
        C = heads * case["width"]                              # head size = width
        dense = CausalSelfAttention(C, heads, 0.0, bias, "float64", generator=gen)
        tp = ParallelSelfAttention(C, heads, 0.0, bias, **kw)
    tp.load_state_dict(shard_state_dict(tp, dense.state_dict()))

    n_in = 2 * C if kind == "row" else C
    x = rng.standard_normal((B, T, n_in))
    xd = Tensor(backend.from_host(x), requires_grad=True)
    yd = dense(xd)
    dy = rng.standard_normal(yd.shape)
    yd.backward(backend.from_host(dy))
    y_want, dx_want = backend.to_host(yd.data), backend.to_host(xd.grad)

    # what this rank holds of the input, and of the output and its gradient
    if kind == "column":                       # rows: this rank's output features
        x_axis = 1 if sp else None
        rows = backend.to_host(tp.rows)
        y_want = y_want if case["gather"] else y_want[..., rows]
        dy_mine = dy if case["gather"] else np.ascontiguousarray(dy[..., rows])
    else:                                      # row: input features split; sp: positions
        x_axis = 2 if kind == "row" else (1 if sp else None)
        y_want = _split(y_want, 1, t, r) if sp else y_want
        dy_mine = _split(dy, 1, t, r) if sp else dy
    x_mine = x if x_axis is None else _split(x, x_axis, t, r)
    xt = Tensor(backend.from_host(x_mine), requires_grad=True)
    yt = tp(xt)
    yt.backward(backend.from_host(dy_mine))
    y_got = backend.to_host(yt.data)
    dx_want_mine = dx_want if x_axis is None else _split(dx_want, x_axis, t, r)
    want_grads = shard_state_dict(tp, {n: p.grad for n, p in dense.named_parameters()})
    out = {
        "forward": float(np.abs(y_got - y_want).max()),
        "dx": float(np.abs(backend.to_host(xt.grad) - dx_want_mine).max()),
        "params": _err({n: p.grad for n, p in tp.named_parameters()}, want_grads),
    }
    if kind == "column":
        # the slice of the product, computed in one process at the shard's width:
        # equal bit for bit (the dense product at full width may round differently
        # only because BLAS picks another kernel for another matrix width)
        w, b = dense.weight.data[tp.rows], (dense.bias.data[tp.rows] if bias else 0)
        own = (backend.from_host(x.reshape(-1, C)) @ w.T + b).reshape(B, T, -1)  # as Linear
        own = backend.to_host(own)
        mine = y_got if not case["gather"] else y_got[..., backend.to_host(tp.rows)]
        out["exact_vs_slice"] = bool((mine == own).all())
    return out


sizes = dict(width=st.integers(1, 4), batch=st.integers(1, 3), length=st.integers(1, 3),
             seed=st.integers(0, 2**16), bias=st.booleans())


@settings(max_examples=10, deadline=None)
@given(case=st.fixed_dictionaries({**sizes, "gather": st.booleans()}))
def test_column_parallel_forward_equals_dense_slice_exactly(world, case):
    for result in world.run(layer_case, {**case, "kind": "column"}):
        assert result["exact_vs_slice"], "column-parallel output differs from x A_i^T"
        assert result["forward"] <= TOL and result["dx"] <= TOL and result["params"] <= TOL


def integer_column_case(seed):
    """Small-integer inputs and weights: every summation order gives the same bits,
    so the gathered output must equal the dense one exactly (only data moved)."""
    t = dist.get_world_size()
    rng = np.random.default_rng(seed)
    C = 3 * t
    dense = Linear(C, 4 * t, True, "float64")
    dense.weight.data[...] = backend.from_host(rng.integers(-3, 4, (4 * t, C)).astype("float64"))
    dense.bias.data[...] = backend.from_host(rng.integers(-3, 4, 4 * t).astype("float64"))
    tp = ColumnParallelLinear(C, 4 * t, True, gather_output=True, dtype="float64")
    tp.load_state_dict(shard_state_dict(tp, dense.state_dict()))
    x = backend.from_host(rng.integers(-3, 4, (2, 5, C)).astype("float64"))
    return bool((backend.to_host(tp(Tensor(x)).data) == backend.to_host(dense(Tensor(x)).data)).all())


@pytest.mark.parametrize("seed", [0, 1])
def test_column_parallel_gathered_output_is_bitwise_dense(world, seed):
    assert all(world.run(integer_column_case, seed))


@settings(max_examples=10, deadline=None)
@given(case=st.fixed_dictionaries({**sizes, "sp": st.booleans(),
                                   "kind": st.sampled_from(["row", "mlp", "attention"]),
                                   "heads_per_rank": st.integers(1, 2)}))
def test_row_mlp_attention_match_dense_forward_and_every_gradient(world, case):
    for result in world.run(layer_case, case):
        assert max(result.values()) <= TOL, (case, result)


def gpt_case(case):
    t = dist.get_world_size()
    cfg = GPTConfig(block_size=case["length"] * t, vocab_size=case["vocab"] * t,
                    n_layer=case["layers"], n_head=case["heads"] * t, n_embd=case["heads"] * t * 2,
                    bias=case["bias"], tie_weights=case["tie"], dtype="float64", seed=case["seed"])
    rng = np.random.default_rng(case["seed"])
    idx = backend.from_host(rng.integers(0, cfg.vocab_size, (2, cfg.block_size)))
    tgt = backend.from_host(rng.integers(0, cfg.vocab_size, (2, cfg.block_size)))
    dense = GPT(cfg)
    _, loss_d = dense(idx, tgt)
    loss_d.backward()
    tp = TensorParallelGPT(cfg, sequence_parallel=case["sp"])
    _, loss = tp(idx, tgt)
    loss.backward()
    norms = (0.0, 0.0)
    if case["clip"]:   # optim's clip on this rank's pieces: the whole model's norm
        norms = tuple(clip_grad_norm_(m.parameters(), 0.05) for m in (dense, tp))
    want = shard_state_dict(tp, {n: p.grad for n, p in dense.named_parameters()})
    return {"loss": abs(float(loss.data) - float(loss_d.data)),
            "params": _err({n: p.grad for n, p in tp.named_parameters()}, want),
            "norm": abs(norms[0] - norms[1])}


@settings(max_examples=8, deadline=None)
@given(case=st.fixed_dictionaries(dict(length=st.integers(1, 3), vocab=st.integers(2, 5),
                                       layers=st.integers(1, 2), heads=st.integers(1, 2),
                                       bias=st.booleans(), tie=st.booleans(), sp=st.booleans(),
                                       clip=st.booleans(), seed=st.integers(0, 2**16))))
def test_tensor_parallel_gpt_matches_single_process(world, case):
    for result in world.run(gpt_case, case):
        assert max(result.values()) <= TOL, (case, result)


def count_mlp_collectives(sp):
    """Collective calls of one ParallelMLP forward, then of its backward."""
    t = dist.get_world_size()
    mlp = ParallelMLP(4 * t, dtype="float64", sequence_parallel=sp)
    x = Tensor(backend.from_host(np.ones((2, 2 * t, 4 * t))), requires_grad=True)
    stats = dist.get_stats()
    stats.reset()
    y = mlp(x)
    forward = {k: v["calls"] for k, v in stats.per_collective.items()}
    stats.reset()
    y.backward(backend.from_host(np.ones(y.shape)))
    backward = {k: v["calls"] for k, v in stats.per_collective.items()}
    return forward, backward


def test_parallel_mlp_makes_one_all_reduce_per_direction(world):
    if world.world_size == 1:
        pytest.skip("a group of one communicates nothing")
    for forward, backward in world.run(count_mlp_collectives, False):
        assert forward == {"all_reduce": 1} and backward == {"all_reduce": 1}
    # sequence parallel: the all-reduce becomes an all-gather + a reduce-scatter
    # (plus, in backward, the all-reduce of c_proj's bias gradient, summed over positions)
    for forward, backward in world.run(count_mlp_collectives, True):
        assert forward == {"all_gather": 1, "reduce_scatter": 1}
        assert backward == {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 1}


def vocab_ce_case(seed):
    """Cross-entropy from vocabulary shards: the dense value and gradient, and no
    collective larger than a few numbers per row."""
    t, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((3, 4, 5 * t)) * 3
    tgt = rng.integers(0, 5 * t, (3, 4))
    tgt[0, 0] = -100                                          # an ignored position
    dense = Tensor(backend.from_host(z), requires_grad=True)
    from minidist.nn.functional import cross_entropy
    want = cross_entropy(dense, backend.from_host(tgt))
    want.backward()
    zt = Tensor(backend.from_host(_split(z, 2, t, r)), requires_grad=True)
    dist.get_stats().reset()
    loss = vocab_parallel_cross_entropy(zt, backend.from_host(tgt))
    loss.backward()
    moved = dist.get_stats().per_collective
    grad_err = float(np.abs(backend.to_host(zt.grad) - _split(backend.to_host(dense.grad), 2, t, r)).max())
    return abs(float(loss.data) - float(want.data)), grad_err, moved


def test_vocab_parallel_cross_entropy_matches_dense_without_gathering_logits(world):
    for loss_err, grad_err, moved in world.run(vocab_ce_case, 3):
        assert loss_err <= TOL and grad_err <= TOL
        assert "all_gather" not in moved
        sent = sum(v["bytes_sent"] for v in moved.values())
        assert sent <= 2 * 3 * 3 * 4 * 8 * 2   # 3 rows of N = 12 float64s, twice, at most


def test_vocab_parallel_cross_entropy_on_one_rank_is_the_dense_one_bit_for_bit(world):
    """With t = 1 no sum is split: the loss and its gradient (softmax as e^(log-softmax),
    as the dense loss computes it) are the dense ones to the last bit, so a composed model
    of degree 1 trains exactly as one process (tests/parallel/compare)."""
    if world.world_size != 1:
        pytest.skip("t > 1 adds the softmax's denominator over ranks: another order")
    for seed in range(4):
        for loss_err, grad_err, _ in world.run(vocab_ce_case, seed):
            assert loss_err == 0.0 and grad_err == 0.0


def heads_error():
    try:
        ParallelSelfAttention(8, 2)
    except ValueError as e:
        return str(e)
    return ""


def test_attention_heads_not_divisible_by_tp_is_an_error_that_says_so(world):
    if world.world_size not in (3, 4):
        pytest.skip("2 heads divide among 1 or 2 ranks")
    for message in world.run(heads_error):
        assert "n_head=2 is not divisible by the tensor-parallel size" in message


def test_a_gpt_with_moe_blocks_is_sent_to_expert_parallelism():
    """Refused before any communication, with what to use instead (not a KeyError from
    the dense state dict's expert weights)."""
    from minidist.parallel.tensor.gpt import TensorParallelGPT
    with pytest.raises(ValueError, match=r"MoE blocks \(moe_every=2\) is split by expert"):
        TensorParallelGPT(GPTConfig(n_layer=2, moe_every=2))
