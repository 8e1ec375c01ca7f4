"""parallelize_module: the styles reproduce the dense model and the hand-written layers.

Worlds of 1, 2 and 4 ranks. Every rank builds the dense module from a seed,
parallelizes a copy with a plan and runs both on the same input and upstream
gradient. Float64: outputs and gradients equal the dense ones to 1e-12 (a
row-parallel sum is the dense sum in another order) and equal minidist's
Megatron layers (parallel/tensor) bit for bit, since the same sums run in the
same order. CommDebugMode counts Megatron's f and g: one all-reduce forward and
one backward per MLP.
"""
import copy

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([1, 2, 4])
TOL = 1e-12


def _host(t):
    return backend.to_host(t.data if hasattr(t, "data") else t)


def mlp_case(case):
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Shard
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module)
    from minidist.nn import MLP
    from minidist.parallel import ParallelMLP, shard_state_dict
    t, r = dist.get_world_size(), dist.get_rank()
    C, sp = case["width"] * t, case["sp"]
    B, T = 2, 2 * t
    gen = backend.Generator(case["seed"])
    dense = MLP(C, 4 * C, 0.0, case["bias"], "float64", generator=gen)
    rng = np.random.default_rng(case["seed"])
    x_full = rng.standard_normal((B, T, C))
    dy_full = rng.standard_normal((B, T, C))
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))

    def run(model, x, dy):
        xt = Tensor(backend.from_host(x), requires_grad=True)
        y = model(xt)
        y.backward(backend.from_host(dy))
        return _host(y), _host(xt.grad)

    tp = copy.deepcopy(dense)
    y_dense, dx_dense = run(dense, x_full, dy_full)
    if sp:
        plan = {"c_fc": ColwiseParallel(input_layouts=Shard(1)),
                "c_proj": RowwiseParallel(output_layouts=Shard(1))}
    else:
        plan = {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()}
    parallelize_module(tp, mesh, plan)
    x, dy = x_full, dy_full
    if sp:   # this rank's positions
        x, dy = (np.split(a, t, axis=1)[r] for a in (x_full, dy_full))
    with CommDebugMode() as comm:
        y_tp, dx_tp = run(tp, x, dy)
    megatron = ParallelMLP(C, 4 * C, 0.0, case["bias"], "float64", sequence_parallel=sp)
    megatron.load_state_dict(shard_state_dict(megatron, dense.state_dict()))
    y_meg, dx_meg = run(megatron, x, dy)
    grads_tp = {n: _host(p.grad) for n, p in tp.named_parameters()}
    grads_meg = {n: _host(p.grad) for n, p in megatron.named_parameters()}
    grads_dense = {n: _host(p.grad) for n, p in dense.named_parameters()}
    return dict(y=(y_dense, y_tp, y_meg), dx=(dx_dense, dx_tp, dx_meg),
                grads=(grads_dense, grads_tp, grads_meg), comm=comm.get_phase_counts(),
                shapes={n: p.shape for n, p in tp.named_parameters()})


@settings(max_examples=4, deadline=None)
@given(width=st.integers(1, 3), bias=st.booleans(), sp=st.booleans(),
       seed=st.integers(0, 2**16))
def test_tp_mlp_equals_dense_and_megatron_layers(world, width, bias, sp, seed):
    t = world.world_size
    case = dict(width=width, bias=bias, sp=sp, seed=seed)
    for r, out in enumerate(world.run(mlp_case, case)):
        y_dense, y_tp, y_meg = out["y"]
        dx_dense, dx_tp, dx_meg = out["dx"]
        if sp:
            y_dense, dx_dense = (np.split(a, t, axis=1)[r] for a in (y_dense, dx_dense))
        np.testing.assert_allclose(y_tp, y_dense, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(dx_tp, dx_dense, rtol=TOL, atol=TOL)
        assert y_tp.tobytes() == y_meg.tobytes() and dx_tp.tobytes() == dx_meg.tobytes()
        dense, tp, meg = out["grads"]
        for name, g in tp.items():
            assert g.tobytes() == meg[name].tobytes(), name
            axis = {"c_fc.weight": 0, "c_fc.bias": 0, "c_proj.weight": 1}.get(name)
            want = dense[name] if axis is None else np.split(dense[name], t, axis=axis)[r]
            np.testing.assert_allclose(g, want, rtol=TOL, atol=TOL)
        if t > 1:
            f, g = ("all_gather_into_tensor", "reduce_scatter_tensor") if sp else \
                ("all_reduce", "all_reduce")
            fwd, bwd = out["comm"]["forward"], out["comm"]["backward"]
            if sp:   # the row bias's gradient, from T/t positions per rank, is all-reduced
                assert fwd == {f: 1, g: 1}
                assert bwd == ({f: 1, g: 1, "all_reduce": 1} if bias else {f: 1, g: 1})
            else:
                assert fwd == {"all_reduce": 1} and bwd == {"all_reduce": 1}


def missing_case(_):
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from minidist.nn import MLP
    mesh = init_device_mesh(backend.device_type(), (backend_world_size(),))
    try:
        parallelize_module(MLP(4, 8), mesh, {"c_fcc": ColwiseParallel()})
    except ValueError as e:
        return str(e)
    return "no error"


def backend_world_size():
    import minidist.distributed as dist
    return dist.get_world_size()


def test_plan_naming_a_missing_module_is_an_error(world):
    for message in world.run(missing_case, None):
        assert "'c_fcc'" in message and "no such module" in message and "c_fc" in message


def sequence_parallel_case(seed):
    """LayerNorm under SequenceParallel, then the MLP's column / row layers taking and
    giving Shard(1), and PrepareModuleInput turning a Replicate input into Shard(1)."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Replicate, Shard
    from minidist.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                      RowwiseParallel, SequenceParallel,
                                                      parallelize_module)
    from minidist.nn import MLP, LayerNorm, Module

    class NormMLP(Module):
        def __init__(self, C):
            super().__init__()
            self.ln = LayerNorm(C, dtype="float64")
            self.mlp = MLP(C, 4 * C, 0.0, True, "float64", generator=backend.Generator(seed))

        def forward(self, x):
            return self.mlp(self.ln(x))

    t, r = dist.get_world_size(), dist.get_rank()
    C, T = 4, 2 * t
    rng = np.random.default_rng(seed)
    x_full, dy_full = rng.standard_normal((2, T, C)), rng.standard_normal((2, T, C))
    dense = NormMLP(C)
    dense.ln.weight.data[...] = backend.from_host(rng.standard_normal(C))
    model = copy.deepcopy(dense)
    mesh = init_device_mesh(backend.device_type(), (t,))
    parallelize_module(model.ln, mesh, SequenceParallel())     # then its input, outside
    parallelize_module(model, mesh, {
        "ln": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1)),
        "mlp.c_fc": ColwiseParallel(input_layouts=Shard(1)),
        "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1))})
    out = []
    for m, x in ((dense, x_full), (model, x_full)):
        xt = Tensor(backend.from_host(x), requires_grad=True)
        y = m(xt)
        dy = dy_full if m is dense else np.split(dy_full, t, axis=1)[r]
        y.backward(backend.from_host(dy))
        out.append((_host(y), _host(xt.grad), _host(m.ln.weight.grad), _host(m.ln.bias.grad)))
    return out


def test_sequence_parallel_layer_norm_and_prepare_module_input(world):
    t = world.world_size
    for r, (dense, sp) in enumerate(world.run(sequence_parallel_case, 7)):
        np.testing.assert_allclose(sp[0], np.split(dense[0], t, axis=1)[r], rtol=TOL, atol=TOL)
        for got, want in zip(sp[1:], dense[1:]):     # dx (Replicate input), LN's grads
            np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


def embedding_case(seed):
    """A vocab-parallel embedding (RowwiseParallel on Embedding) against the dense one."""
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import RowwiseParallel, parallelize_module
    from minidist.nn import Embedding
    t = dist.get_world_size()
    rng = np.random.default_rng(seed)
    dense = Embedding(4 * t, 3, "float64", generator=backend.Generator(seed))
    model = copy.deepcopy(dense)
    parallelize_module(model, init_device_mesh(backend.device_type(), (t,)), RowwiseParallel())
    ids = backend.from_host(rng.integers(0, 4 * t, (2, 5)))
    dy = backend.from_host(rng.standard_normal((2, 5, 3)))
    out = []
    for m in (dense, model):
        with CommDebugMode() as comm:
            y = m(ids)
            y.backward(dy)
        out.append((_host(y), _host(m.weight.grad)))
    return out, comm.get_phase_counts()


def test_vocab_parallel_embedding_equals_the_dense_lookup(world):
    t = world.world_size
    for r, ((dense, tp), counts) in enumerate(world.run(embedding_case, 4)):
        assert tp[0].tobytes() == dense[0].tobytes()          # one summand, zeros elsewhere
        assert tp[1].tobytes() == np.split(dense[1], t)[r].tobytes()
        if t > 1:
            assert counts == {"forward": {"all_reduce": 1}, "backward": {}}


def loss_parallel_case(seed):
    """F.cross_entropy under loss_parallel on [Shard(1)] logits (uneven vocabulary pieces)
    against F.cross_entropy on the full logits: loss and gradient, and the collectives."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Shard, distribute_tensor
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import loss_parallel
    from minidist.nn import functional as F
    t = dist.get_world_size()
    rng = np.random.default_rng(seed)
    V = 3 * t + 1
    full = rng.standard_normal((6, V)) * 3
    targets = rng.integers(0, V, 6)
    targets[1] = -100                                        # ignored
    dense = Tensor(backend.from_host(full), requires_grad=True)
    want = F.cross_entropy(dense, backend.from_host(targets))
    want.backward()
    logits = distribute_tensor(backend.from_host(full), init_device_mesh(backend.device_type(), (t,)),
                               [Shard(1)])
    logits._local_tensor.requires_grad_()
    with loss_parallel(), CommDebugMode() as comm:
        loss = F.cross_entropy(logits, backend.from_host(targets))
        loss.backward()
    gathered = distribute_tensor(backend.from_host(full), logits.device_mesh, [Shard(1)])
    gathered._local_tensor.requires_grad_()
    outside = F.cross_entropy(gathered, backend.from_host(targets))    # no loss_parallel
    outside.backward()
    return (float(backend.to_host(loss.to_local().data)), float(backend.to_host(want.data)),
            backend.to_host(logits.grad.full_tensor().data), backend.to_host(dense.grad),
            comm.get_phase_counts(), [repr(p) for p in loss.placements],
            float(backend.to_host(outside.to_local().data)),
            backend.to_host(gathered.grad.full_tensor().data))


def test_loss_parallel_equals_cross_entropy_on_full_logits(world):
    t = world.world_size
    for loss, want, grad, want_grad, counts, placements, outside, outside_grad in \
            world.run(loss_parallel_case, 9):
        assert abs(loss - want) <= TOL and abs(outside - want) <= TOL
        assert placements == ["Replicate()"]          # a DTensor, as torch's
        np.testing.assert_allclose(grad, want_grad, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(outside_grad, want_grad, rtol=TOL, atol=TOL)
        if t > 1:   # max, sum of exponentials, target logit; backward: none
            assert counts == {"forward": {"all_reduce": 3}, "backward": {}}


def frozen_case(seed):
    """A dense MLP whose c_fc.weight is frozen, and its tensor-parallel copy, one AdamW
    step each on the same input: (requires_grad of each piece, whether it has a .grad,
    max |piece - the dense rows| of c_fc.weight after the step)."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module)
    from minidist.nn import MLP
    from minidist.optim import AdamW
    t, r = dist.get_world_size(), dist.get_rank()
    dense = MLP(4, 4 * t, 0.0, True, "float64", generator=backend.Generator(seed))
    dense.c_fc.weight.requires_grad = False
    tp = copy.deepcopy(dense)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    parallelize_module(tp, mesh, {"c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})
    x = np.random.default_rng(seed).standard_normal((2, 3, 4))
    for model in (dense, tp):
        opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        y = model(Tensor(backend.from_host(x)))
        (y * y).sum().backward()
        opt.step()
    flags = {n: (p.requires_grad, p.grad is not None) for n, p in tp.named_parameters()}
    rows = backend.to_host(dense.c_fc.weight.data)[r * 4:(r + 1) * 4]
    return flags, float(np.abs(backend.to_host(tp.c_fc.weight.data) - rows).max())


def test_a_frozen_parameter_is_cut_into_a_frozen_piece(world):
    """A style's piece keeps the parameter's requires_grad, so the optimizer leaves a
    frozen weight as the dense model's (a trainable piece before: 1e-2 away in a step)."""
    for flags, diff in world.run(frozen_case, 4):
        assert flags["c_fc.weight"] == (False, False)
        assert flags["c_proj.weight"] == (True, True)
        assert diff == 0.0
