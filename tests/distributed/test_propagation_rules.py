"""The sharding rules for mean, keepdim sums, softmax, norms, embedding and views: each op's
output and gradients equal the single-process op on the full tensors.

Hypothesis draws batches of cases: the op, a (a, b, c) input with lengths 1..5
(uneven pieces; empty ones where a length is shorter than the mesh dim), a mesh
((2,), (4,), (2, 2), (6,), (2, 3)) and each input's placements (Replicate,
Partial, Shard of any dim). Every rank distributes the same global inputs, runs
the op on DTensors through minidist.nn.functional and the DTensor methods, and
returns the full output, its placements and the inputs' gradients of
loss = sum(W * out). The oracle is the same op on plain Tensors of the whole
arrays in one process (float64, 1e-12). No rule here may fall back (no warning)
except embedding's pairs outside its table.
"""
import numpy as np
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.test_redistribute import _placements
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 4, 6])
MESHES = {2: [(2,)], 4: [(4,), (2, 2)], 6: [(6,), (2, 3)]}
TOL = 1e-12
OPS = ["mean", "sum_keepdim", "mean_keepdim", "softmax", "log_softmax", "layer_norm",
       "rms_norm", "embedding", "reshape", "transpose", "permute"]


def apply(case, xs):
    """The op on DTensors or on Tensors: the same code, as torch's API promises."""
    from minidist.nn import functional as F
    op, arg = case["op"], case["arg"]
    if op in ("mean", "mean_keepdim", "sum_keepdim"):
        fn = xs[0].sum if op == "sum_keepdim" else xs[0].mean
        return fn(arg, op != "mean")
    if op in ("softmax", "log_softmax"):
        return getattr(F, op)(xs[0], arg)
    if op == "layer_norm":
        return F.layer_norm(xs[0], xs[1], xs[2])
    if op == "rms_norm":
        return F.rms_norm(xs[0], xs[0].shape[-1], xs[1], 1e-6)
    if op == "embedding":
        return F.embedding(xs[1], xs[0])
    if op == "reshape":
        return xs[0].reshape(*arg)
    if op == "transpose":
        return xs[0].transpose(*arg)
    return xs[0].permute(*arg)


def rule_case(cases):
    """On every rank, each case: (full output, output placements, full gradients, warnings)."""
    import warnings

    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import distribute_tensor
    results = []
    for case in cases:
        mesh = init_device_mesh(backend.device_type(), case["mesh"])
        xs = []
        for full, spec in zip(case["inputs"], case["placements"]):
            x = distribute_tensor(backend.from_host(full), mesh, _placements(spec))
            if full.dtype == np.float64:
                x._local_tensor.requires_grad_()
            xs.append(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = apply(case, xs)
        full = out.full_tensor()
        (full * backend.from_host(case["weight"])).sum().backward()
        results.append((backend.to_host(full.data), [repr(p) for p in out.placements],
                        [backend.to_host(x.grad.full_tensor().data) for x in xs
                         if x.requires_grad], [str(w.message) for w in caught]))
    return results


def oracle(case):
    """The op on Tensors of the whole arrays in this process: output and input gradients."""
    from minidist.autograd import Tensor
    xs = [Tensor(backend.from_host(a), requires_grad=True) if a.dtype == np.float64
          else backend.from_host(a) for a in case["inputs"]]
    out = apply(case, xs)
    (out * Tensor(backend.from_host(case["weight"]))).sum().backward()
    return backend.to_host(out.data), [backend.to_host(x.grad) for x in xs
                                       if isinstance(x, Tensor)]


def _kinds(ndim):
    return [("R",), ("P", "sum")] + [("S", d) for d in range(ndim)]


class Drawn:
    """Choices drawn by hypothesis (``draw``) or by a NumPy generator (``rng``: the
    PyTorch comparison, whose one example must not be hypothesis's smallest)."""

    def __init__(self, draw=None, rng=None):
        self.draw, self.rng = draw, rng

    def integer(self, lo, hi):
        return self.draw(st.integers(lo, hi)) if self.draw else int(self.rng.integers(lo, hi + 1))

    def choice(self, options):
        if self.draw:
            return self.draw(st.sampled_from(options))
        return options[int(self.rng.integers(len(options)))]


def make_case(pick, mesh):
    """One case: an op, its inputs, their placements, the loss weight (module docstring)."""
    op = pick.choice(OPS)
    a, b, c = (pick.integer(1, 5) for _ in range(3))
    rng = np.random.default_rng(pick.integer(0, 999))
    x = rng.standard_normal((a, b, c))
    arg = None
    if op in ("mean", "mean_keepdim", "sum_keepdim"):
        arg = pick.choice([0, 1, 2, -1, (0, 2), None])
    elif op in ("softmax", "log_softmax"):
        arg = pick.integer(-3, 2)
    elif op == "reshape":
        total = a * b * c
        options = [(a * b, c), (a, b * c), (total,), (1, a, b, c), (a, b, 1, c)]
        options += [(total // k, k) for k in range(2, total + 1) if total % k == 0]
        options += [(k, total // k, 1) for k in (2, 3) if total % k == 0]
        arg = pick.choice(options)
    elif op == "transpose":
        arg = (pick.integer(-3, 2), pick.integer(-3, 2))
    elif op == "permute":
        arg = pick.choice([(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
    inputs = [x]
    if op == "layer_norm":
        inputs += [rng.standard_normal(c), rng.standard_normal(c)]
    elif op == "rms_norm":
        inputs += [rng.standard_normal(c)]
    elif op == "embedding":
        inputs = [rng.standard_normal((a * 2, c)), rng.integers(0, a * 2, (b, 3))]
    placements = [[pick.choice(_kinds(full.ndim)) for _ in mesh] for full in inputs]
    if op == "embedding":      # ids are integers: no Partial
        placements[1] = [p if p[0] != "P" else ("R",) for p in placements[1]]
    case = dict(mesh=mesh, op=op, arg=arg, inputs=inputs, placements=placements)
    case["weight"] = rng.standard_normal(np.shape(oracle({**case, "weight": 0.0})[0]))
    return case


# no shrinking: each example is a world run, and a batch of 8 cases names its failing one
@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_rules_equal_the_op_on_full_tensors(world, data):
    mesh = data.draw(st.sampled_from(MESHES[world.world_size]))
    cases = [make_case(Drawn(draw=data.draw), mesh) for _ in range(8)]
    ranks = world.run(rule_case, cases)
    for i, case in enumerate(cases):
        want, want_grads = oracle(case)
        what = (case["op"], case["arg"], case["placements"], case["mesh"])
        for results in ranks:
            out, placements, grads, warned = results[i]
            np.testing.assert_allclose(out, want, rtol=TOL, atol=TOL, err_msg=str(what))
            assert len(grads) == len(want_grads)
            for got, expected in zip(grads, want_grads):
                np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL,
                                           err_msg=str(what))
            assert not warned or case["op"] == "embedding", (what, warned)


# (op, arg, input shapes, placements of each input on a mesh of 2) -> output placements
TABLE = [
    ("sum_keepdim", 1, [(2, 4, 3)], [["S1"]], ["P(sum)"]),
    ("mean", 1, [(2, 4, 3)], [["S1"]], ["P(avg)"]),
    ("mean", 1, [(2, 4, 3)], [["S2"]], ["S1"]),
    ("mean_keepdim", 2, [(2, 4, 3)], [["S2"]], ["R"]),          # 3 rows cut unevenly
    ("mean", 0, [(2, 4, 3)], [["P"]], ["R"]),                   # Partial(sum): not linear
    ("softmax", -1, [(2, 4, 3)], [["S0"]], ["S0"]),
    ("log_softmax", 1, [(2, 4, 3)], [["S1"]], ["R"]),           # the normalised dim: gathered
    ("layer_norm", None, [(2, 4, 3), (3,), (3,)], [["S1"], ["R"], ["R"]], ["S1"]),
    ("rms_norm", None, [(2, 4, 4), (4,)], [["S2"], ["S0"]], ["R"]),
    ("embedding", None, [(6, 4), (2, 3)], [["S0"], ["R"]], ["P(sum)"]),
    ("embedding", None, [(6, 4), (2, 3)], [["S1"], ["R"]], ["S2"]),
    ("embedding", None, [(6, 4), (2, 3)], [["R"], ["S1"]], ["S1"]),
    ("reshape", (8, 3), [(2, 4, 3)], [["S0"]], ["S0"]),         # merge, outermost cut
    ("reshape", (8, 3), [(2, 4, 3)], [["S1"]], ["R"]),          # merge, inner cut
    ("reshape", (2, 2, 2, 3), [(2, 4, 3)], [["S1"]], ["S1"]),   # split, 2 % 2 == 0
    ("reshape", (3, 8), [(2, 4, 3)], [["S0"]], ["R"]),          # regroup, 3 % 2 != 0
    ("transpose", (0, 2), [(2, 4, 3)], [["S0"]], ["S2"]),
    ("permute", (2, 0, 1), [(2, 4, 3)], [["S1"]], ["S2"]),
]


def _spec(text):
    return ("R",) if text == "R" else ("P", "sum") if text == "P" else ("S", int(text[1:]))


def _name(text):
    return {"R": "Replicate()", "P(sum)": "Partial(sum)", "P(avg)": "Partial(avg)"}.get(
        text) or f"Shard(dim={text[1:]})"


def table_cases():
    rng = np.random.default_rng(0)
    cases = []
    for op, arg, shapes, specs, _ in TABLE:
        inputs = [rng.standard_normal(s) for s in shapes]
        if op == "embedding":
            inputs[1] = rng.integers(0, shapes[0][0], shapes[1])
        case = dict(mesh=(2,), op=op, arg=arg, inputs=inputs,
                    placements=[[_spec(p) for p in spec] for spec in specs])
        case["weight"] = rng.standard_normal(np.shape(oracle({**case, "weight": 0.0})[0]))
        cases.append(case)
    return cases


def test_each_rule_gives_its_tables_placements(world):
    if world.world_size != 2:
        return
    cases = table_cases()
    for results in world.run(rule_case, cases):
        for case, row, (out, placements, grads, warned) in zip(cases, TABLE, results):
            assert placements == [_name(p) for p in row[4]], row
            assert not warned, row
            want, want_grads = oracle(case)
            np.testing.assert_allclose(out, want, rtol=TOL, atol=TOL, err_msg=str(row))
            for got, expected in zip(grads, want_grads):
                np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL, err_msg=str(row))


def view_case(_):
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh(backend.device_type(), (2,))
    x = distribute_tensor(backend.xp.ones((2, 4, 3)), mesh, [Shard(1)])
    kept = x.view(2, 2, 2, 3).placements
    try:
        x.view(8, 3)
    except ValueError as e:
        return kept, str(e)
    return kept, None


def test_view_refuses_to_move_a_cut_dim_where_reshape_gathers_it(world):
    from minidist.distributed.tensor import Shard
    if world.world_size != 2:
        return
    for kept, message in world.run(view_case, None):
        assert kept == (Shard(1),)
        assert message is not None and "Shard(dim=1)" in message and "reshape" in message
