"""ZeRO stages 1, 2, 3 equal DDP (and one process); their per-rank bytes match the formulas.

Same runs as test_ddp.py (ddp_cases.py): world sizes 1..4, random shapes, bucket
sizes, micro-batches (accumulated by calling backward several times before
``step()``), SGD with momentum or AdamW, clipping by the norm of the whole
model. Float64 parameters after k steps equal DDP's and single-process
training's within 1e-12: only the order of the float sums differs
(reduce-scatter + all-gather instead of all-reduce, per-shard squares for the
norm).
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc.memory import zero_memory_per_gpu
from minidist.comm import World

from ..data import ddp_cases as C
from ..data.test_ddp import cases


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_zero_stages_match_ddp_and_single_process(world, data):
    case = data.draw(cases(world.world_size, "ddp"))
    case["prefetch"] = data.draw(st.booleans())
    ref = C.train_single(case)
    ddp = world.run(C.train_on_rank, case)[0]["params"]
    for stage in ("zero1", "zero2", "zero3"):
        for rank, res in enumerate(world.run(C.train_on_rank, dict(case, strategy=stage))):
            for name, oracle in (("DDP", ddp), ("single process", ref)):
                diff = C.max_diff(res["params"], oracle)
                assert diff <= 1e-12, f"{stage} rank {rank} vs {name}: {diff:.3e}; {case}"


def test_zero_with_amsgrad_matches_single_process(world):
    """AMSGrad's running max of v is elementwise, so each rank keeps it for its shard alone."""
    case = dict(world=world.world_size, dtype="float64", seed=3, steps=3, micro=2, batch=2,
                d_in=4, hidden=5, d_out=3, optimizer="amsgrad", clip=None, bucket_cap_mb=25.0)
    ref = C.train_single(case)
    for stage in ("zero1", "zero2", "zero3"):
        for rank, res in enumerate(world.run(C.train_on_rank, dict(case, strategy=stage))):
            diff = C.max_diff(res["params"], ref)
            assert diff <= 1e-12, f"{stage} rank {rank} vs single process: {diff:.3e}"


def test_zero_collectives_per_step(world):
    """Stage 1: one reduce-scatter and one all-gather per bucket per step; stage 2: one
    reduce-scatter per bucket per micro-batch; stage 3: per unit and micro-batch, two
    all-gathers (forward, backward) and one reduce-scatter."""
    base = dict(world=world.world_size, dtype="float64", seed=1, steps=2, micro=3, batch=2,
                d_in=4, hidden=5, d_out=3, optimizer="adamw", clip=None, bucket_cap_mb=25.0)
    z1 = world.run(C.train_on_rank, dict(base, strategy="zero1"))[0]["calls"]
    assert (z1["reduce_scatter"], z1["all_gather"]) == (2, 2)
    z2 = world.run(C.train_on_rank, dict(base, strategy="zero2"))[0]["calls"]
    assert (z2["reduce_scatter"], z2["all_gather"]) == (6, 2)
    z3 = world.run(C.train_on_rank, dict(base, strategy="zero3"))[0]["calls"]
    # 3 units x 3 micro-batches x 2 steps
    assert (z3["reduce_scatter"], z3["all_gather"]) == (18, 2 * 18)


def memory_on_rank(stage, precision, sizes):
    """After one step and one more backward: the wrapper's report, and P."""
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.nn import MLP
    from minidist.parallel.zero.memory_probe import model_state_bytes
    model = MLP(*sizes)
    x = Tensor(backend.Generator(0).normal((4, sizes[0])))
    p_count = model.num_parameters()
    return model_state_bytes(model, x, stage, precision), p_count


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_per_rank_matches_the_formula(world, stage, precision):
    """16P (DDP); 4 + 12/N, 2 + 14/N, 16/N bytes per parameter (mixed); 8 + 8/N,
    4 + 12/N, 16/N (fp32) -- up to padding: < N elements per flat group, 16 bytes each."""
    n = world.world_size
    sizes = (7, 13)   # MLP(7, 13): 7*13 + 13 + 13*7 + 7 = 202 parameters, 2-4 flat groups
    reports = world.run(memory_on_rank, stage, precision, sizes)
    p_count = reports[0][1]
    want = zero_memory_per_gpu(p_count, n, stage, precision)
    for rank, (rep, _) in enumerate(reports):
        assert rep["total"] == rep["params"] + rep["grads"] + rep["optimizer"]
        assert want <= rep["total"] <= want + 4 * n * 16, (rank, rep, want)
        if stage == 0:
            assert rep["total"] == 16 * p_count


def test_zero_refuses_optimizers_that_are_not_elementwise():
    from minidist.nn import MLP
    from minidist.optim import LAMB
    from minidist.parallel import Zero1
    with pytest.raises(TypeError, match="elementwise"):
        Zero1(MLP(2, 3), LAMB)


def test_zero1_refuses_a_parameter_without_gradient(world):
    """ZeRO-1 filled a missing gradient with zeros and stepped the flat shard whole, so
    AdamW moved a parameter one process leaves alone (7e-3 after three steps with one
    left out of a step); it now refuses at step(), naming it, as ZeRO-2 and DDP do."""
    from tests.distributed.test_fsdp_post_backward import sitting_out_case
    if 6 % world.world_size:
        pytest.skip("six rows do not split over this world")
    for message in world.run(sitting_out_case, "zero1"):
        assert isinstance(message, str) and "ZeRO-1" in message and "b.weight" in message


def test_zero3_refuses_a_parameter_its_unit_did_not_use(world):
    """ZeRO-3 filled the gradient of a parameter its unit did not use with zeros and
    stepped the unit's shard whole, so AdamW moved what one process leaves alone (one
    unit for the model, ``b`` left out of a step). It now refuses, naming it, as
    fully_shard and ZeRO-1 do; with the default units (one per Linear) ``b``'s unit does
    not run that step and the model trains as one process."""
    from tests.distributed.test_fsdp_post_backward import sitting_out_case
    if 6 % world.world_size:
        pytest.skip("six rows do not split over this world")
    for message in world.run(sitting_out_case, "zero3 root"):
        assert isinstance(message, str) and "ZeRO-3" in message and "b.weight" in message
        assert "own unit" in message
    for distance in world.run(sitting_out_case, "zero3"):
        assert distance <= 1e-12
