"""Sharding propagation: every rule's output is the single-process op on the full tensors,
and so are the gradients that come back through it.

Hypothesis draws the op (matmul, add, sub, mul, sum), shapes with uneven pieces,
and each input's placements on 1-D and 2-D meshes; every rank distributes the
same global inputs, runs the op on DTensors, and returns the output's full
tensor, its placements, the inputs' gradients of loss = sum(W * out) and the
warnings raised. Oracle: NumPy on the full arrays (float64, 1e-12). Where a rule
exists no input is made Replicate and nothing is warned; where none does, one
warning names the op.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.test_redistribute import _placements
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 4])
MESHES = {2: [(2,)], 4: [(4,), (2, 2)]}
TOL = 1e-12


def op_case(case):
    import warnings

    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import distribute_tensor
    mesh = init_device_mesh(backend.device_type(), case["mesh"])
    xs = []
    for full, spec in zip(case["inputs"], case["placements"]):
        x = distribute_tensor(backend.from_host(full), mesh, _placements(spec))
        x._local_tensor.requires_grad_()
        xs.append(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if case["op"] == "matmul":
            out = xs[0] @ xs[1]
        elif case["op"] == "sum":
            out = xs[0].sum(case["dim"])
        else:
            out = {"add": xs[0].__add__, "sub": xs[0].__sub__, "mul": xs[0].__mul__}[
                case["op"]](xs[1])
    full = out.full_tensor()
    (full * backend.from_host(case["weight"])).sum().backward()
    return (backend.to_host(full.data), [repr(p) for p in out.placements],
            [backend.to_host(x.grad.full_tensor().data) for x in xs],
            [str(w.message) for w in caught])


def oracle(case):
    ins, w = case["inputs"], case["weight"]
    if w is None:                 # the output only (for its shape)
        return {"matmul": lambda: ins[0] @ ins[1],
                "sum": lambda: ins[0].sum(axis=case["dim"]),
                "add": lambda: ins[0] + ins[1], "sub": lambda: ins[0] - ins[1],
                "mul": lambda: ins[0] * ins[1]}[case["op"]](), None
    if case["op"] == "matmul":
        a, b = ins
        return a @ b, [w @ b.T, np.einsum("bmk,bmn->kn", a, w)]
    if case["op"] == "sum":
        out = ins[0].sum(axis=case["dim"])
        return out, [np.broadcast_to(np.expand_dims(w, case["dim"]), ins[0].shape)]
    a, b = ins
    if case["op"] == "add":
        return a + b, [w, w]
    if case["op"] == "sub":
        return a - b, [w, -w]
    return a * b, [w * b, w * a]


@st.composite
def cases(draw, n):
    mesh = draw(st.sampled_from(MESHES[n]))
    op = draw(st.sampled_from(["matmul", "add", "sub", "mul", "sum"]))
    m, k, nn = (draw(st.integers(1, 5)) for _ in range(3))
    shapes = {"matmul": [(2, m, k), (k, nn)], "sum": [(2, m, k)]}.get(op, [(m, k), (m, k)])
    rng = np.random.default_rng(draw(st.integers(0, 999)))
    inputs = [rng.standard_normal(s) for s in shapes]
    placements = []
    for s in shapes:
        kinds = [("R",), ("P", "sum")] + [("S", d) for d in range(len(s))]
        placements.append(draw(st.lists(st.sampled_from(kinds), min_size=len(mesh),
                                        max_size=len(mesh))))
    case = dict(mesh=mesh, op=op, inputs=inputs, placements=placements,
                dim=draw(st.integers(0, 2)))
    out_shape = {"matmul": (2, m, nn), "sum": tuple(s for d, s in enumerate((2, m, k))
                                                    if d != case["dim"])}.get(op, (m, k))
    case["weight"] = rng.standard_normal(out_shape)
    return case


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_propagated_op_equals_the_op_on_full_tensors(world, data):
    case = data.draw(cases(world.world_size))
    want, want_grads = oracle(case)
    for out, placements, grads, warned in world.run(op_case, case):
        np.testing.assert_allclose(out, want, rtol=TOL, atol=TOL)
        for got, expected in zip(grads, want_grads):
            np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)
        assert len(warned) <= 1
        if warned:
            assert case["op"] in warned[0] and "Replicate()" in warned[0]
            assert placements == ["Replicate()"] * len(case["mesh"])


def rule_case(_):
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    xp = backend.xp
    mesh = init_device_mesh(backend.device_type(), (2,))
    a = distribute_tensor(xp.ones((2, 4, 6)), mesh, [Shard(2)])
    b = distribute_tensor(xp.ones((6, 4)), mesh, [Shard(0)])
    c = distribute_tensor(xp.ones((6, 4)), mesh, [Shard(1)])
    r = distribute_tensor(xp.ones((2, 4, 6)), mesh, [Replicate()])
    return [(a @ b).placements, (r @ c).placements, a.sum(2).placements,
            (distribute_tensor(xp.ones(3), mesh, [Partial()]) +
             distribute_tensor(xp.ones(3), mesh, [Partial()])).placements]


def test_megatron_rules_give_partial_and_shard(world):
    from minidist.distributed.tensor import Partial, Shard
    if world.world_size != 2:
        return
    for found in world.run(rule_case, None):
        assert found == [(Partial(),), (Shard(2),), (Partial(),), (Partial(),)]


def _all_cases(seed):
    """Every op with every pair of placements on a mesh of the world's ranks, shapes
    with uneven pieces."""
    rng = np.random.default_rng(seed)
    out = []
    for op in ("matmul", "add", "sub", "mul", "sum"):
        shapes = {"matmul": [(2, 3, 5), (5, 3)], "sum": [(2, 3, 5)]}.get(op, [(3, 5), (3, 5)])
        kinds = [[("R",), ("P", "sum")] + [("S", d) for d in range(len(s))] for s in shapes]
        combos = [[a] for a in kinds[0]] if op == "sum" else \
            [[a, b] for a in kinds[0] for b in kinds[1]]
        for combo in combos:
            for dim in ((0, 1, 2) if op == "sum" else (0,)):
                case = dict(mesh=None, op=op, dim=dim,
                            inputs=[rng.standard_normal(s) for s in shapes],
                            placements=[[p] for p in combo])
                want, _ = oracle({**case, "weight": None})
                case["weight"] = rng.standard_normal(np.shape(want))
                out.append(case)
    return out


def every_pair_case(seed):
    import minidist.distributed as dist
    results = []
    for case in _all_cases(seed):
        case["mesh"] = (dist.get_world_size(),)
        results.append(op_case(case))
    return results


def test_every_rule_and_every_fallback_on_a_1d_mesh(world):
    cases = _all_cases(11)
    for rank_results in world.run(every_pair_case, 11):
        for case, (out, placements, grads, warned) in zip(cases, rank_results):
            want, want_grads = oracle(case)
            what = (case["op"], case["placements"], case["dim"])
            np.testing.assert_allclose(out, want, rtol=TOL, atol=TOL, err_msg=str(what))
            for got, expected in zip(grads, want_grads):
                np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL, err_msg=str(what))
            assert len(warned) <= 1, what
