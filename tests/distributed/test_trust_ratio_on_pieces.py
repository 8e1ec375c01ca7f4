"""LAMB and LARS on parameters cut into pieces (``fully_shard``; a tensor-parallel plan)
take the trust ratio's norms over the whole tensor, so they step as one process does.

A trust ratio divides two norms of a layer, ||w|| / ||u||. On a piece those are the
piece's norms unless its sums of squares are added over the pieces' holders
(``optim.whole_norm``, by the piece registry); a Linear(4 -> 4) stepped from its own
piece's norms lands 1e-4 .. 1e-3 from one process. Float64, two steps, one process on
the whole batch as the oracle, every rank comparing the gathered parameters (1e-12).
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.gathered import whole_parameters
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
TOL = 1e-12
STEPS, BATCH = 2, 4


def _optimizer(name, params):
    from minidist.optim import LAMB, LARS
    if name == "lamb":
        return LAMB(params, lr=1e-2, weight_decay=0.01)
    return LARS(params, lr=1.0, weight_decay=1e-3, trust_coefficient=0.01)


def _models(case):
    from minidist.nn import GPT, GPTConfig, Linear
    if case["model"] == "linear":
        def make():
            return Linear(4, 4, dtype="float64", generator=backend.Generator(case["seed"]))
        return make(), make(), None
    cfg = GPTConfig(block_size=4, vocab_size=12, n_layer=1, n_head=2, n_embd=8,
                    dtype="float64", seed=case["seed"])
    return GPT(cfg), GPT(cfg), cfg


def _cut(case, model, cfg):
    """Cut ``model`` over the world as the case says -> whether each rank takes half the
    batch (data parallel) or all of it (tensor parallel)."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard
    from minidist.distributed.tensor.parallel import (ColwiseParallel, gpt_tp_plan,
                                                      parallelize_module)
    from minidist.distributed.tensor.placement_types import Replicate
    if case["strategy"] == "fully_shard":
        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
        return True
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    plan = (ColwiseParallel(output_layouts=Replicate()) if cfg is None
            else gpt_tp_plan(cfg, 2))
    parallelize_module(model, mesh, plan)
    return False


def _loss(model, cfg, x, y):
    from minidist.autograd import Tensor
    if cfg is None:
        out = model(Tensor(backend.from_host(x)))
        return ((out - Tensor(backend.from_host(y))) ** 2).mean()
    return model(backend.from_host(x), backend.from_host(y))[1]


def _gathered(case, model):
    """name -> the whole parameter, gathered from the pieces."""
    from minidist.distributed.fsdp import sharded_state_dict
    if case["strategy"] == "fully_shard":
        return {n: backend.to_host(d.full_tensor().data) for n, d in
                sharded_state_dict(model).items()}
    return whole_parameters(model)


def trust_ratio_case(case):
    """Every rank: max |gathered parameter - one process's| after ``STEPS`` steps."""
    import minidist.distributed as dist
    single, model, cfg = _models(case)
    halves = _cut(case, model, cfg)
    opts = [_optimizer(case["optimizer"], m.parameters()) for m in (single, model)]
    rng = np.random.default_rng(case["seed"])
    r = dist.get_rank()
    for _ in range(STEPS):
        if cfg is None:
            x, y = rng.standard_normal((BATCH, 4)), rng.standard_normal((BATCH, 4))
        else:
            x, y = rng.integers(0, 12, (BATCH, 4)), rng.integers(0, 12, (BATCH, 4))
        mine = slice(r * BATCH // 2, (r + 1) * BATCH // 2) if halves else slice(None)
        _loss(single, cfg, x, y).backward()
        _loss(model, cfg, x[mine], y[mine]).backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
    theirs = {n: backend.to_host(q.data) for n, q in single.named_parameters()}
    return max(float(np.abs(a.reshape(theirs[n].shape) - theirs[n]).max())
               for n, a in _gathered(case, model).items())


@settings(max_examples=4, deadline=None)
@given(case=st.fixed_dictionaries(dict(
    strategy=st.sampled_from(["fully_shard", "tensor_parallel"]),
    optimizer=st.sampled_from(["lamb", "lars"]), model=st.sampled_from(["linear", "gpt"]),
    seed=st.integers(0, 1000))))
def test_lamb_and_lars_on_pieces_step_as_one_process(world, case):
    for err in world.run(trust_ratio_case, case):
        assert err <= TOL, (case, err)


def test_lamb_and_lars_on_a_column_parallel_linear_step_as_one_process(world):
    for optimizer in ("lamb", "lars"):
        for strategy in ("fully_shard", "tensor_parallel"):
            case = dict(strategy=strategy, optimizer=optimizer, model="linear", seed=7)
            for err in world.run(trust_ratio_case, case):
                assert err <= TOL, (case, err)
