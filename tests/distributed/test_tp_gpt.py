"""A GPT made tensor-parallel by a plan (a dict of styles, as torchtitan writes Llama's)
trains to the same parameters as one process: float64, 1e-12, after k AdamW steps.

Two plans: the MLPs alone, and the whole model (``gpt_tp_plan``: attention with
c_attn cut head by head, MLP, vocabulary-parallel embedding and head), with and
without sequence parallelism, and with the head's logits left sharded for
``loss_parallel``. CommDebugMode's counts per step equal the formula
(Megatron: 2 all-reduces forward and 2 backward per block), and a block under the
plan equals minidist's Megatron ParallelBlock bit for bit (the same sums in the
same order)."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 4])
TOL = 1e-12


def _host(t):
    return backend.to_host(t.data if hasattr(t, "data") else t)


def _full(model, name, p, shape):
    """A parameter of a parallelized model, gathered, in the dense model's ``shape`` (a
    fused c_attn weight's (3, C, C) stack as (3C, C))."""
    from minidist.distributed.tensor.parallel import parameter_as_dtensor
    owner_name, attr = name.rsplit(".", 1)
    owner = dict(model.named_modules())[owner_name]
    if attr in owner.__dict__.get("_dtensor_placements", {}):
        return _host(parameter_as_dtensor(owner, attr).full_tensor()).reshape(shape)
    return _host(p)


def gpt_case(case):
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      gpt_tp_plan, loss_parallel,
                                                      parallelize_module)
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    t = dist.get_world_size()
    cfg = GPTConfig(block_size=2 * t, vocab_size=3 * t, n_layer=case["layers"], n_head=t,
                    n_embd=4 * t, dtype="float64", seed=case["seed"], bias=case["bias"])
    single = GPT(cfg)
    tp = copy.deepcopy(single)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    if case["plan"] == "mlp":
        plan = {"blocks.*.mlp.c_fc": ColwiseParallel(),
                "blocks.*.mlp.c_proj": RowwiseParallel()}
    else:
        plan = gpt_tp_plan(cfg, t, sequence_parallel=case["plan"] == "full+sp",
                           vocab_parallel_loss=case["plan"] == "full+loss_parallel")
    parallelize_module(tp, mesh["tp"], plan)
    rng = np.random.default_rng(case["seed"])
    V, T = cfg.vocab_size, cfg.block_size
    batches = [(backend.from_host(rng.integers(0, V, (2, T))),
                backend.from_host(rng.integers(0, V, (2, T)))) for _ in range(case["steps"])]
    counts = []
    for model in (single, tp):
        opt = AdamW(model.parameters(), lr=1e-2)
        for idx, targets in batches:
            # loss_parallel: cross-entropy on the DTensor logits the head hands on (a
            # no-op for the models whose logits are whole)
            with CommDebugMode() as comm, loss_parallel():
                _, loss = model(idx, targets)
                opt.zero_grad()
                loss.backward()
            opt.step()
            if model is tp:
                counts.append(comm.get_phase_counts())
    single_params = dict(single.named_parameters())
    errors = {}
    for name, p in tp.named_parameters():
        want = _host(single_params[name])
        errors[name] = float(np.abs(_full(tp, name, p, want.shape) - want).max())
    return errors, counts


def expected_counts(plan, layers, bias):
    """Collectives per step of the plan (docs/placements.md, 'Tensor parallelism as
    placements'): per block f and g for attention and for the MLP."""
    L = layers
    if plan == "mlp":
        return {"forward": {"all_reduce": L}, "backward": {"all_reduce": L}}
    if plan == "full":   # + wte's all-reduce, lm_head's gather of logits and its f
        return {"forward": {"all_reduce": 2 * L + 1, "all_gather_into_tensor": 1},
                "backward": {"all_reduce": 2 * L + 1}}
    if plan == "full+loss_parallel":   # no gather: 3 all-reduces of B T numbers instead
        return {"forward": {"all_reduce": 2 * L + 4}, "backward": {"all_reduce": 2 * L + 1}}
    # sequence parallel: f -> all-gather, g -> reduce-scatter; wte and wpe reduce-scatter
    # their lookups, lm_head gathers positions and logits; backward the adjoints, and an
    # all-reduce per parameter used on T/t positions (norm weights and biases, row biases)
    norms = 2 * L + 1
    per_norm = 2 if bias else 1
    row_biases = 2 * L if bias else 0
    return {"forward": {"all_gather_into_tensor": 2 * L + 2, "reduce_scatter_tensor": 2 * L + 2},
            "backward": {"all_gather_into_tensor": 2 * L + 2,
                         "reduce_scatter_tensor": 2 * L + 1,
                         "all_reduce": per_norm * norms + row_biases}}


@pytest.mark.parametrize("plan", ["mlp", "full", "full+sp", "full+loss_parallel"])
@settings(max_examples=2, deadline=None)
@given(layers=st.integers(1, 2), steps=st.integers(1, 2), bias=st.booleans(),
       seed=st.integers(0, 99))
def test_tp_plan_gpt_trains_like_one_process(world, plan, layers, steps, bias, seed):
    case = dict(plan=plan, layers=layers, steps=steps, bias=bias, seed=seed)
    for errors, counts in world.run(gpt_case, case):
        assert max(errors.values()) <= TOL, errors
        for c in counts:
            assert c == expected_counts(plan, layers, bias), c


def block_case(case):
    """One GPT block under the plan, and minidist's Megatron ParallelBlock holding the same
    pieces, on the same input and upstream gradient."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Replicate, Shard
    from minidist.distributed.tensor.parallel import (ColwiseParallel, FusedColwiseParallel,
                                                      RowwiseParallel, SequenceParallel,
                                                      parallelize_module)
    from minidist.nn import GPTConfig
    from minidist.nn.gpt import Block
    from minidist.parallel import shard_state_dict
    from minidist.parallel.tensor.gpt import ParallelBlock
    t, r, sp = dist.get_world_size(), dist.get_rank(), case["sp"]
    cfg = GPTConfig(block_size=2 * t, n_head=t * case["heads"], n_embd=4 * t * case["heads"],
                    dtype="float64", bias=case["bias"], attention=case["attention"])
    dense = Block(cfg, backend.Generator(case["seed"]))
    megatron = ParallelBlock(cfg, None, sp, backend.Generator(0))
    megatron.load_state_dict(shard_state_dict(megatron, dense.state_dict()))
    seq = Shard(1) if sp else Replicate()
    plan = {"attn.c_attn": FusedColwiseParallel(input_layouts=seq),
            "attn.c_proj": RowwiseParallel(output_layouts=seq),
            "mlp.c_fc": ColwiseParallel(input_layouts=seq),
            "mlp.c_proj": RowwiseParallel(output_layouts=seq)}
    if sp:
        plan.update({"ln_1": SequenceParallel(), "ln_2": SequenceParallel()})
    mesh = init_device_mesh(backend.device_type(), (t,))
    tp = parallelize_module(copy.deepcopy(dense), mesh, plan)
    rng = np.random.default_rng(case["seed"])
    x, dy = (rng.standard_normal((2, cfg.block_size, cfg.n_embd)) for _ in range(2))
    if sp:
        x, dy = (np.split(a, t, axis=1)[r] for a in (x, dy))
    out = {}
    for name, model in (("tp", tp), ("megatron", megatron)):
        xt = Tensor(backend.from_host(x), requires_grad=True)
        y = model(xt)
        y.backward(backend.from_host(dy))
        out[name] = dict(y=_host(y), dx=_host(xt.grad),
                         grads={n: _host(p.grad) for n, p in model.named_parameters()})
    return out


@settings(max_examples=3, deadline=None)
@given(sp=st.booleans(), bias=st.booleans(), heads=st.integers(1, 2),
       attention=st.sampled_from(["naive", "flash"]), seed=st.integers(0, 2**16))
def test_tp_plan_block_equals_megatron_bit_for_bit(world, sp, bias, heads, attention, seed):
    case = dict(sp=sp, bias=bias, heads=heads, attention=attention, seed=seed)
    for out in world.run(block_case, case):
        tp, meg = out["tp"], out["megatron"]
        assert tp["y"].tobytes() == meg["y"].tobytes()
        assert tp["dx"].tobytes() == meg["dx"].tobytes()
        assert tp["grads"].keys() == meg["grads"].keys()
        for name, g in tp["grads"].items():
            assert g.tobytes() == meg["grads"][name].tobytes(), name


def plan_errors_case(_):
    """Plans that cannot hold: each a ValueError naming what to change."""
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import (ColwiseParallel, FusedColwiseParallel,
                                                      gpt_tp_plan, parallelize_module)
    from minidist.nn import GPT, GPTConfig, LayerNorm
    t = dist.get_world_size()
    mesh = init_device_mesh(backend.device_type(), (t,))
    cfg = GPTConfig(block_size=8, vocab_size=4 * t, n_layer=1, n_head=t, n_embd=4 * t)
    attempts = {
        "heads": lambda: gpt_tp_plan(GPTConfig(n_head=t + 1, n_embd=4 * (t + 1)), t),
        "tied": lambda: parallelize_module(GPT(cfg), mesh, {"lm_head": ColwiseParallel()}),
        "fused_norm": lambda: parallelize_module(LayerNorm(4), mesh, FusedColwiseParallel()),
        "fused_chunks": lambda: parallelize_module(GPT(cfg), mesh,
                                                   {"blocks.0.attn.c_attn":
                                                    FusedColwiseParallel(chunks=5)}),
    }
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            messages[name] = "no error"
        except ValueError as e:
            messages[name] = str(e)
    return messages


def test_a_plan_that_cannot_hold_is_a_clear_error(world):
    for m in world.run(plan_errors_case, None):
        assert "n_head=" in m["heads"] and "tensor-parallel size" in m["heads"]
        assert "tied" in m["tied"] and "wte.weight" in m["tied"]
        assert "shards a Linear" in m["fused_norm"]
        assert "chunks" in m["fused_chunks"]
