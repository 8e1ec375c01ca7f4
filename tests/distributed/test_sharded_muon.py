"""Sharded Muon, both schemes, trains the pieces to one process's parameters, and the
round-robin scheme iterates each matrix once in the world where gather iterates it N times.

Float64, three steps, one process on the whole batch with ``optim.Muon`` as the oracle;
every rank compares the gathered parameters (1e-12). Layouts: fully_shard (worlds 2-4,
matrices whose rows do not divide by the world, so some ranks hold fewer rows or none),
ZeRO-1 and ZeRO-2 flat shards (a matrix straddling two shards), a tensor-parallel plan
(ColwiseParallel rows, RowwiseParallel columns).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.gathered import whole_parameters
from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()
TOL = 1e-12
STEPS = 3
# (in, out) of three bias-free Linears: weights (5, 6), (7, 5), (3, 7): tall, wide, none
# of their row counts divisible by 2, 4 (3 and 6 by 3: 7 and 5 are not)
WIDTHS = [(6, 5), (5, 7), (7, 3)]
HYPER = dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True)


def _stack(seed, widths):
    from minidist.nn import Linear, Sequential
    gen = backend.Generator(seed)
    return Sequential(*[Linear(i, o, bias=False, dtype="float64", generator=gen)
                        for i, o in widths])


def _cut(case, model):
    """Cut ``model`` as the case says -> (its optimizer, whether each rank takes a part of
    the batch, the ZeRO wrapper or None)."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard
    from minidist.distributed.muon import ShardedMuon, fully_shard_pieces, tensor_parallel_pieces
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module)
    from minidist.optim import Muon
    from minidist.parallel.zero import Zero1, Zero2
    scheme = case["scheme"]
    if case["layout"] == "fully_shard":
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return ShardedMuon(model.parameters(), fully_shard_pieces(model), scheme, **HYPER), \
            True, None
    if case["layout"] in ("zero1", "zero2"):
        zero = (Zero1 if case["layout"] == "zero1" else Zero2)(
            model, Muon, scheme=scheme, max_grad_norm=case.get("clip"), **HYPER)
        return zero.optimizer, True, zero
    mesh = init_device_mesh(backend.device_type(), (case["world"],), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    return ShardedMuon(model.parameters(), tensor_parallel_pieces(model), scheme, **HYPER), \
        False, None


def _whole(case, model):
    from minidist.distributed.fsdp import sharded_state_dict
    if case["layout"] == "fully_shard":
        return {n: backend.to_host(d.full_tensor().data)
                for n, d in sharded_state_dict(model).items()}
    return whole_parameters(model)


def sharded_muon_case(case):
    """Every rank: (max |gathered parameter - one process's|, its iterations run)."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.optim import Muon
    widths = WIDTHS if case["layout"] != "tensor_parallel" else [(6, 4 * case["world"]), (4 * case["world"], 5)]
    single, model = _stack(case["seed"], widths), _stack(case["seed"], widths)
    from minidist.optim import clip_grad_norm_
    from minidist.parallel import found_inf_reduce
    from minidist.precision import GradScaler
    reference = Muon(single.parameters(), **HYPER)
    opt, split_batch, zero = _cut(case, model)
    n, r = dist.get_world_size(), dist.get_rank()
    batch = 2 * n
    rng = np.random.default_rng(case["seed"])
    clip, scaled = case.get("clip"), case.get("scaler", False)
    # a power of two: scaling and unscaling are exact, so the oracle is the same bits
    scalers = [GradScaler(init_scale=2.0 ** 8, enabled=scaled),
               GradScaler(init_scale=2.0 ** 8, enabled=scaled,
                          found_inf_reduce=found_inf_reduce() if zero is not None else None)]
    for _ in range(STEPS):
        x = rng.standard_normal((batch, widths[0][0]))
        mine = slice(r * 2, r * 2 + 2) if split_batch else slice(None)
        for m, rows, scaler in ((single, slice(None), scalers[0]), (model, mine, scalers[1])):
            out = m(Tensor(backend.from_host(x[rows])))
            scaler.scale((out ** 2).mean()).backward()
        for o, m, scaler in ((reference, single, scalers[0]), (opt, model, scalers[1])):
            if o is opt and zero is not None:
                zero.step(scaler if scaled else None)       # it unscales and clips itself
                zero.zero_grad()
            else:
                scaler.unscale_(o)
                if clip is not None:
                    clip_grad_norm_(m.parameters(), clip)
                scaler.step(o)
                o.zero_grad()
            scaler.update()
    theirs = {name: backend.to_host(q.data) for name, q in single.named_parameters()}
    err = max(float(np.abs(a.reshape(theirs[name].shape) - theirs[name]).max())
              for name, a in _whole(case, model).items())
    return err, opt.iterations_run


def _check(worlds, case):
    results = worlds(case["world"]).run(sharded_muon_case, case)
    for err, _ in results:
        assert err <= TOL, (case, err)
    matrices = STEPS * (len(WIDTHS) if case["layout"] != "tensor_parallel" else 2)
    total = sum(iterations for _, iterations in results)
    expected = matrices if case["scheme"] == "round_robin" else case["world"] * matrices
    assert total == expected, (case, [i for _, i in results])


@settings(max_examples=6, deadline=None)
@given(case=st.fixed_dictionaries(dict(
    layout=st.sampled_from(["fully_shard", "zero1", "zero2", "tensor_parallel"]),
    scheme=st.sampled_from(["gather", "round_robin"]), world=st.integers(2, 4),
    seed=st.integers(0, 1000))))
def test_sharded_muon_trains_to_one_process_and_counts_iterations(worlds, case):
    _check(worlds, case)


@pytest.mark.parametrize("layout", ["fully_shard", "zero1", "tensor_parallel"])
@pytest.mark.parametrize("scheme", ["gather", "round_robin"])
def test_each_layout_and_scheme_at_world_3(worlds, layout, scheme):
    _check(worlds, dict(layout=layout, scheme=scheme, world=3, seed=5))


@pytest.mark.parametrize("layout", ["fully_shard", "zero1", "zero2", "tensor_parallel"])
def test_a_gradient_clip_and_a_grad_scaler_before_sharded_muon_match_one_process(worlds, layout):
    """The clip's norm over the pieces is the whole gradient's, and the scaler unscales
    every piece: the sharded run is one process's run with the same clip and scaler."""
    _check(worlds, dict(layout=layout, scheme="round_robin", world=2, seed=3, clip=0.05,
                        scaler=True))


def plain_muon_on_pieces(layout):
    """Every rank: the message Muon raises for pieces of matrices (None: accepted)."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard
    from minidist.distributed.muon import ShardedMuon, fully_shard_pieces
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module)
    from minidist.optim import Muon
    model = _stack(0, [(6, 8), (8, 5)])
    tp_plan = {"0": ColwiseParallel(), "1": RowwiseParallel()}
    if layout == "fully_shard":
        fully_shard(model)
    elif layout == "tensor_parallel":
        parallelize_module(model, init_device_mesh(backend.device_type(), (2,)), tp_plan)
    else:        # tp, then fully_shard over dp: ShardedMuon given fully_shard's cut only
        mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan)
        fully_shard(model, mesh=mesh["dp"])
    try:
        if layout == "2d":
            ShardedMuon(model.parameters(), fully_shard_pieces(model), **HYPER)
        else:
            Muon(model.parameters(), **HYPER)
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("layout,world", [("fully_shard", 2), ("tensor_parallel", 2),
                                          ("2d", 4)])
def test_muon_refuses_pieces_it_cannot_bring_together(worlds, layout, world):
    """Newton-Schulz on one rank's piece is not Muon's step (0.03 from one process after
    one step, lr 0.05, for the first two): Muon refuses pieces, ShardedMuon those it is
    not told how to bring together over every cut."""
    for message in worlds(world).run(plain_muon_on_pieces, layout):
        assert message is not None and "needs the whole matrix" in message
        assert "ShardedMuon" in message
