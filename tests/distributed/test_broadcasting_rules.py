"""Broadcasting add, sub, mul of DTensors: the output and the gradients equal the op on the full
arrays, no input falls back to Replicate with a warning, and shapes that do not broadcast are
refused with both shapes named.

Hypothesis draws the op, two shapes that broadcast (lengths 1..5 with size-1 dims, a missing
leading dim or two, uneven and empty pieces), a mesh ((2,), (4,), (2, 2)) and each input's
placements (Replicate, Partial, Shard of any of its dims). Every rank distributes the same
global inputs, runs the op on DTensors and returns the full output, its placements and the
inputs' gradients of loss = sum(W * out). Oracle: NumPy on the full arrays, a broadcast
input's gradient summed over the dims it was broadcast along (float64, 1e-12). Placements are
compared with torch's own DTensor in test_broadcasting_against_torch.py.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.test_ops import op_case
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 4])
MESHES = {2: [(2,)], 4: [(4,), (2, 2)]}
TOL = 1e-12


def _sum_to(grad, shape):
    """grad summed over the dims ``shape`` was broadcast along (the oracle's unbroadcast)."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead else grad
    keep = tuple(d for d, n in enumerate(shape) if n == 1 and grad.shape[d] != 1)
    return grad.sum(axis=keep, keepdims=True) if keep else grad


def oracle(case):
    a, b = case["inputs"]
    out = {"add": a + b, "sub": a - b, "mul": a * b}[case["op"]]
    w = case["weight"]
    ga, gb = {"add": (w, w), "sub": (w, -w), "mul": (w * b, w * a)}[case["op"]]
    return out, [_sum_to(np.broadcast_to(ga, out.shape), a.shape),
                 _sum_to(np.broadcast_to(gb, out.shape), b.shape)]


def _kinds(ndim):
    return [("R",), ("P", "sum")] + [("S", d) for d in range(ndim)]


@st.composite
def broadcast_shapes(draw):
    """Two shapes that broadcast: a common shape, each input dropping leading dims and
    setting some dims to 1."""
    full = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    shapes = []
    for _ in range(2):
        shape = [n if draw(st.booleans()) else 1 for n in full]
        shapes.append(tuple(shape[draw(st.integers(0, len(full) - 1)):]))
    return shapes


@st.composite
def cases(draw, mesh):
    op = draw(st.sampled_from(["add", "sub", "mul"]))
    shapes = draw(broadcast_shapes())
    rng = np.random.default_rng(draw(st.integers(0, 999)))
    inputs = [rng.standard_normal(s) for s in shapes]
    placements = [draw(st.lists(st.sampled_from(_kinds(len(s))), min_size=len(mesh),
                                max_size=len(mesh))) for s in shapes]
    out_shape = np.broadcast_shapes(*shapes)
    return dict(mesh=mesh, op=op, inputs=inputs, placements=placements,
                weight=rng.standard_normal(out_shape))


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_broadcasting_op_equals_the_op_on_full_arrays(world, data):
    case = data.draw(cases(data.draw(st.sampled_from(MESHES[world.world_size]))))
    want, want_grads = oracle(case)
    what = (case["op"], [x.shape for x in case["inputs"]], case["placements"], case["mesh"])
    for out, _, grads, warned in world.run(op_case, case):
        assert out.shape == want.shape, what
        np.testing.assert_allclose(out, want, rtol=TOL, atol=TOL, err_msg=str(what))
        for got, expected in zip(grads, want_grads):
            assert got.shape == expected.shape, what
            np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL, err_msg=str(what))
        assert not warned, (what, warned)


def bias_case(_):
    """x (5, 7) Shard(0) + b (7,) Replicate: Shard(0), and nothing moves (no collective)."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Replicate, Shard, distribute_tensor
    from minidist.distributed.tensor.debug import CommDebugMode
    mesh = init_device_mesh(backend.device_type(), (2,))
    x = distribute_tensor(backend.xp.ones((5, 7)), mesh, [Shard(0)])
    b = distribute_tensor(backend.xp.ones(7), mesh, [Replicate()])
    with CommDebugMode() as comm:
        y = x + b
    errors = []
    for other in (backend.xp.ones((5, 6)), backend.xp.ones(3)):
        try:
            x + distribute_tensor(other, mesh, [Replicate()])
        except ValueError as e:
            errors.append(str(e))
    return y.placements, y.shape, comm.get_total_counts(), errors


def test_a_bias_on_a_row_shard_stays_shard_and_moves_nothing(world):
    from minidist.distributed.tensor import Shard
    if world.world_size != 2:
        return
    for placements, shape, count, errors in world.run(bias_case, None):
        assert placements == (Shard(0),) and shape == (5, 7) and count == 0
        assert len(errors) == 2
        assert "(5, 7)" in errors[0] and "(5, 6)" in errors[0] and "broadcast" in errors[0]
        assert "(3,)" in errors[1]


def _mlp_loss(x, w1, b1, w2, b2, target):
    """loss = mean((((x @ w1 + b1) ** 2) @ w2 + b2 - target) ** 2): the same code on Tensors
    and on DTensors, biases added by broadcasting."""
    h = x @ w1 + b1                       # (B, H): Shard(-1) under Megatron's column layout
    y = (h * h) @ w2 + b2                 # (B, O): Partial from the row layout, then + b2
    err = y - target
    return (err * err).mean()


def _mlp_arrays(seed):
    rng = np.random.default_rng(seed)
    shapes = dict(x=(4, 3), w1=(3, 5), b1=(5,), w2=(5, 2), b2=(2,), target=(4, 2))
    return {k: rng.standard_normal(s) for k, s in shapes.items()}


PARAMS = ("w1", "b1", "w2", "b2")


def mlp_case(seed):
    """Three SGD steps of the MLP on DTensors: w1, b1 cut along the hidden dim (column),
    w2 along its rows (row), b2 and the data replicated. Returns the full parameters."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Replicate, Shard, distribute_tensor
    import minidist.distributed as dist
    mesh = init_device_mesh(backend.device_type(), (dist.get_world_size(),))
    where = dict(x=[Replicate()], w1=[Shard(1)], b1=[Shard(0)], w2=[Shard(0)], b2=[Replicate()],
                 target=[Replicate()])
    arrays = _mlp_arrays(seed)
    t = {k: distribute_tensor(backend.from_host(v), mesh, where[k]) for k, v in arrays.items()}
    for k in PARAMS:
        t[k]._local_tensor.requires_grad_()
    for _ in range(3):
        _mlp_loss(**t).backward()
        for k in PARAMS:
            local = t[k]._local_tensor
            local.data -= 0.1 * t[k].grad.redistribute(mesh, where[k]).to_local().data
            local.grad = None
    return {k: backend.to_host(t[k].full_tensor().data) for k in PARAMS}


def mlp_oracle(seed):
    from minidist.autograd import Tensor
    t = {k: Tensor(backend.from_host(v), requires_grad=k in PARAMS)
         for k, v in _mlp_arrays(seed).items()}
    for _ in range(3):
        _mlp_loss(**t).backward()
        for k in PARAMS:
            t[k].data -= 0.1 * t[k].grad
            t[k].grad = None
    return {k: backend.to_host(t[k].data) for k in PARAMS}


def test_a_dtensor_mlp_with_broadcast_biases_trains_as_one_process(world):
    want = mlp_oracle(3)
    for got in world.run(mlp_case, 3):
        for k in PARAMS:
            np.testing.assert_allclose(got[k], want[k], rtol=TOL, atol=TOL, err_msg=k)
