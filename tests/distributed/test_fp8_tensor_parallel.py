"""Per-tensor FP8 under tensor parallelism takes each amax over the whole tensor, so it
computes what one process computes with the same recipe.

A site whose weight is a piece (a tensor-parallel plan's slice) max-combines the amax
of each of its casts over the group that cuts it (precision/fp8.py). With the amax of
its own slice a rank would scale differently from one process, and from the other
rank: a column-parallel Linear whose weight's two halves differ in size (rows 4..7
times 20) lands 2e-5 .. 3e-5 away.

- A column-parallel Linear with its output gathered moves data only, so current and
  delayed scaling give one process's scales and parameters bit for bit.
- The GPT under ``gpt_tp_plan`` (float64) adds row-parallel partial sums in another
  order; the scales are still one process's bit for bit and the parameters within 1e-12.
  Attention's products take head-sliced activations, which no registry knows: the
  recipe's ``amax_reduce`` over the tp group combines those (as Transformer Engine's
  ``fp8_group``).
"""
import numpy as np
import pytest

from minidist import backend
from tests.distributed.gathered import whole_parameters
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
STEPS = 3


def _recipe(name, amax_reduce=None):
    from minidist.precision import CurrentScaling, DelayedScaling
    extra = {} if amax_reduce is None else {"amax_reduce": amax_reduce}
    if name == "current":
        return CurrentScaling(**extra)
    return DelayedScaling(amax_history_len=4, **extra)


def linear_case(recipe_name):
    """Every rank: (max |gathered parameter - one process's|, scales equal bit for bit)."""
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from minidist.distributed.tensor.placement_types import Replicate
    from minidist.nn import Linear
    from minidist.optim import SGD
    from minidist.precision import fp8_autocast
    models = [Linear(4, 8, dtype="float64", generator=backend.Generator(3)) for _ in range(2)]
    for m in models:
        m.weight.data[4:] *= 20.0                  # rank 1's half: a 20x larger amax
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    parallelize_module(models[1], mesh, ColwiseParallel(output_layouts=Replicate()))
    recipes = [_recipe(recipe_name), _recipe(recipe_name)]
    opts = [SGD(m.parameters(), lr=0.1) for m in models]
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        x, y = rng.standard_normal((6, 4)), rng.standard_normal((6, 8))
        for m, recipe, opt in zip(models, recipes, opts):
            with fp8_autocast(recipe):
                out = m(Tensor(backend.from_host(x)))
            ((out - Tensor(backend.from_host(y))) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
    theirs = {n: backend.to_host(q.data) for n, q in models[0].named_parameters()}
    err = max(float(np.abs(a - theirs[n]).max()) for n, a in whole_parameters(models[1]).items())
    return err, recipes[0].scales() == recipes[1].scales()


def gpt_case(recipe_name):
    """Every rank: (max |gathered parameter - one process's|, scales equal bit for bit)."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import gpt_tp_plan, parallelize_module
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    from minidist.parallel import amax_reduce
    from minidist.precision import fp8_autocast
    # no biases: a row-parallel layer adds its bias after the sum, outside the FP8 site,
    # where one process casts it with x and W (a difference of placement, not of scale)
    cfg = GPTConfig(block_size=4, vocab_size=12, n_layer=1, n_head=2, n_embd=8, bias=False,
                    dtype="float64", seed=5)
    models = [GPT(cfg), GPT(cfg)]
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    parallelize_module(models[1], mesh, gpt_tp_plan(cfg, 2))
    # attention's products take head-sliced activations, which are no registered pieces:
    # the recipe max-combines every amax over the tp group (replicated ones: a no-op)
    recipes = [_recipe(recipe_name), _recipe(recipe_name, amax_reduce(mesh.get_group("tp")))]
    opts = [AdamW(m.parameters(), lr=1e-2) for m in models]
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        idx, tgt = rng.integers(0, 12, (2, 4)), rng.integers(0, 12, (2, 4))
        for m, recipe, opt in zip(models, recipes, opts):
            with fp8_autocast(recipe):
                _, loss = m(backend.from_host(idx), backend.from_host(tgt))
            loss.backward()
            opt.step()
            opt.zero_grad()
    theirs = {n: backend.to_host(q.data) for n, q in models[0].named_parameters()}
    err = max(float(np.abs(a.reshape(theirs[n].shape) - theirs[n]).max())
              for n, a in whole_parameters(models[1]).items())
    return err, recipes[0].scales() == recipes[1].scales()


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_fp8_column_parallel_linear_equals_one_process_bit_for_bit(world, recipe):
    for err, same_scales in world.run(linear_case, recipe):
        assert same_scales and err == 0.0, (recipe, err, same_scales)


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_fp8_gpt_tp_plan_scales_are_one_process_scales(world, recipe):
    for err, same_scales in world.run(gpt_case, recipe):
        assert same_scales and err <= 1e-12, (recipe, err, same_scales)
