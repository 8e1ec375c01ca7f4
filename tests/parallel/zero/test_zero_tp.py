"""ZeRO-1 / ZeRO-2 over a tensor-parallel GPT (``gpt_tp_plan`` over "tp", ZeRO over "dp"
on a 2 x 2 mesh) clips by the whole model's gradient norm and agrees on skipping a step,
as one process does.

Each ZeRO shard of a tensor-parallel slice is a piece over the tp group as well as over
dp, so the norm adds the slices' shares over tp (autograd/pieces.py) and the replicated
parameters' once, and GradScaler's inf flag is max-combined over tp as over dp. Summing
over dp alone gave each tp rank its own norm (two different clips of one model), and an
inf in tp rank 0's slice made tp rank 0 skip while tp rank 1 stepped.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.gathered import whole_parameters
from tests.distributed.worlds import world_fixture

world = world_fixture([4])
TOL = 1e-12
MAX_NORM = 0.05   # below every step's norm here: each step is clipped
STEPS = 2


def _setup(seed):
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import gpt_tp_plan, parallelize_module
    from minidist.nn import GPT, GPTConfig
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("dp", "tp"))
    cfg = GPTConfig(block_size=4, vocab_size=12, n_layer=1, n_head=2, n_embd=8,
                    dtype="float64", seed=seed)
    single, model = GPT(cfg), GPT(cfg)
    parallelize_module(model, mesh["tp"], gpt_tp_plan(cfg, 2))
    return mesh, single, model


def _batches(seed):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 12, (4, 4)), rng.integers(0, 12, (4, 4))) for _ in range(STEPS)]


def _errors(single, model):
    """max |whole parameter - one process's| over the parameters."""
    theirs = {n: backend.to_host(q.data) for n, q in single.named_parameters()}
    return max(float(np.abs(a.reshape(theirs[n].shape) - theirs[n]).max())
               for n, a in whole_parameters(model).items())


def zero_tp_clipped(stage, seed):
    """Every rank: ``STEPS`` clipped AdamW steps -> (max error, the norms ZeRO returned,
    one process's norms)."""
    from minidist.optim import AdamW, clip_grad_norm_
    from minidist.parallel import Zero1, Zero2
    mesh, single, model = _setup(seed)
    zero = (Zero1 if stage == 1 else Zero2)(model, AdamW, group=mesh.get_group("dp"),
                                            max_grad_norm=MAX_NORM, lr=1e-2)
    opt = AdamW(single.parameters(), lr=1e-2)
    row = mesh.get_local_rank("dp")
    norms, want = [], []
    for idx, tgt in _batches(seed):
        _, loss = single(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        want.append(clip_grad_norm_(single.parameters(), MAX_NORM))
        opt.step()
        opt.zero_grad()
        _, loss = zero(*(backend.from_host(a[2 * row:2 * row + 2]) for a in (idx, tgt)))
        loss.backward()
        norms.append(zero.step())
        zero.zero_grad()
    return _errors(single, model), norms, want


def zero_tp_poisoned(stage, seed):
    """Every rank: one scaled step with an inf in tp rank 0's slice of c_fc's gradient on
    dp rank 0 -> (did my parameters change, the scale after the step)."""
    from minidist.optim import AdamW
    from minidist.parallel import Zero1, Zero2, found_inf_reduce
    from minidist.precision import GradScaler
    mesh, _, model = _setup(seed)
    dp, row = mesh.get_group("dp"), mesh.get_local_rank("dp")

    def poison(weight):   # registered before ZeRO-2's hooks, so it runs before they reduce
        weight.grad[0, 0] = np.inf

    if row == 0 and mesh.get_local_rank("tp") == 0:
        model.blocks[0].mlp.c_fc.weight.register_post_accumulate_grad_hook(poison)
    zero = (Zero1 if stage == 1 else Zero2)(model, AdamW, group=dp, lr=1e-2)
    scaler = GradScaler(init_scale=2.0 ** 10, found_inf_reduce=found_inf_reduce(dp))
    before = [backend.to_host(q.data).copy() for q in model.parameters()]
    idx, tgt = _batches(seed)[0]
    _, loss = zero(*(backend.from_host(a[2 * row:2 * row + 2]) for a in (idx, tgt)))
    scaler.scale(loss).backward()
    zero.step(scaler)
    scaler.update()
    changed = any(not np.array_equal(b, backend.to_host(q.data))
                  for b, q in zip(before, model.parameters()))
    return changed, scaler.get_scale()


@settings(max_examples=2, deadline=None)
@given(stage=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_zero_over_tensor_parallel_clips_by_the_whole_models_norm(world, stage, seed):
    for err, norms, want in world.run(zero_tp_clipped, stage, seed):
        assert np.allclose(norms, want, rtol=TOL, atol=0), (norms, want)
        assert err <= TOL, err


@pytest.mark.parametrize("stage", [1, 2])
def test_an_inf_in_one_tensor_parallel_slice_skips_the_step_on_every_rank(world, stage):
    results = world.run(zero_tp_poisoned, stage, 5)
    assert [changed for changed, _ in results] == [False] * 4, results
    assert [scale for _, scale in results] == [2.0 ** 9] * 4, results


def zero3_tp_clipped(seed):
    """Every rank: ZeRO-3 over the plan, one clipped step -> the error it raised."""
    from minidist.optim import AdamW
    from minidist.parallel import Zero3
    mesh, _, model = _setup(seed)
    zero = Zero3(model, AdamW, group=mesh.get_group("dp"), max_grad_norm=MAX_NORM, lr=1e-2)
    idx, tgt = _batches(seed)[0]
    _, loss = zero(backend.from_host(idx[:2]), backend.from_host(tgt[:2]))
    loss.backward()
    try:
        zero.step()
    except ValueError as e:
        return str(e)
    return None


def test_zero3_over_tensor_parallel_refuses_to_clip_a_mixed_unit(world):
    """A row-parallel Linear's unit holds its weight's slice and its replicated bias in
    one shard: no one group sums that shard's norm, so ZeRO-3 says so instead of
    clipping each tp rank by a different norm."""
    for message in world.run(zero3_tp_clipped, 1):
        assert message is not None and "fully_shard" in message, message
