"""Every redistribute gives back the global tensor, and its gradient is the adjoint.

Hypothesis draws a mesh (1-D and 2-D, up to 6 ranks), a tensor (0 to 3 axes,
lengths 0..7, so pieces are uneven and some empty), a dtype and two lists of
placements. Every rank distributes the same global tensor as the first list,
redistributes it to the second and returns its local piece and the full
tensor. The oracle is the global tensor cut with torch.chunk's rule written out
here: ``c = ceil(L / n)``, piece r holds rows [r c, (r + 1) c) clipped to L.
Bitwise where no Partial is involved; with a Partial (x / n summands) to 1e-12
relative in float64, 1e-5 in float32.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([1, 2, 3, 4, 6])

MESHES = {1: [(1,)], 2: [(2,), (1, 2), (2, 1)], 3: [(3,)], 4: [(4,), (2, 2)],
          6: [(6,), (2, 3), (3, 2)]}


def oracle_piece(full, mesh_shape, placements, coord):
    """The piece of ``full`` that ``coord`` holds (None where a Partial makes it a summand)."""
    piece = full
    for n, p, c in zip(mesh_shape, placements, coord):
        if p[0] == "S":
            d = p[1]
            size = piece.shape[d]
            step = -(-size // n)
            index = [slice(None)] * piece.ndim
            index[d] = slice(min(size, c * step), min(size, (c + 1) * step))
            piece = piece[tuple(index)]
        elif p[0] == "P":
            return None
    return piece


def _placements(spec):
    from minidist.distributed.tensor import Partial, Replicate, Shard
    return [Shard(p[1]) if p[0] == "S" else Partial(p[1]) if p[0] == "P" else Replicate()
            for p in spec]


def redistribute_case(case):
    """On every rank: distribute as src, redistribute to dst; local piece and full tensor."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import distribute_tensor
    mesh = init_device_mesh(backend.device_type(), case["mesh"])
    full = backend.from_host(case["full"])
    x = distribute_tensor(full, mesh, _placements(case["src"]))
    y = x.redistribute(mesh, _placements(case["dst"]))
    return (mesh.get_coordinate(), backend.to_host(y.to_local().data),
            backend.to_host(y.full_tensor().data), y.placements == tuple(_placements(case["dst"])))


@st.composite
def cases(draw, n):
    mesh = draw(st.sampled_from(MESHES[n]))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(["float64", "float32", "int32"]))
    kinds = [("R",)] + [("S", d) for d in range(ndim)]
    if dtype != "int32":
        kinds += [("P", "sum"), ("P", "avg"), ("P", "max")]
    src = draw(st.lists(st.sampled_from(kinds), min_size=len(mesh), max_size=len(mesh)))
    dst = draw(st.lists(st.sampled_from(kinds), min_size=len(mesh), max_size=len(mesh)))
    for i, (a, b) in enumerate(zip(src, dst)):      # Partial(a) -> Partial(b): refused
        if a[0] == "P" and b[0] == "P" and a != b:
            dst[i] = ("R",)
    for side in (src, dst):                         # max does not mix with sum (refused)
        if ("P", "max") in side:
            side[:] = [("R",) if p[0] == "P" and p != ("P", "max") else p for p in side]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    full = np.asarray(rng.standard_normal(shape) * 8).astype(dtype)
    return dict(mesh=mesh, full=full, src=src, dst=dst)


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_redistribute_gives_the_global_tensor(world, data):
    case = data.draw(cases(world.world_size))
    full = case["full"]
    partial = any(p[0] == "P" for p in case["src"] + case["dst"])
    tol = 0.0 if not partial else (1e-12 if full.dtype == np.float64 else 1e-5)
    for coord, local, whole, same_placements in world.run(redistribute_case, case):
        assert same_placements
        np.testing.assert_allclose(whole, full, rtol=tol, atol=tol)
        assert whole.dtype == full.dtype
        piece = oracle_piece(full, case["mesh"], case["dst"], coord)
        if piece is not None:
            assert local.shape == piece.shape
            np.testing.assert_allclose(local, piece, rtol=tol, atol=tol)
            if tol == 0.0:
                assert local.tobytes() == np.ascontiguousarray(piece).tobytes()


def grad_case(case):
    """loss = sum(W * y.full_tensor()) on every rank, y = x.redistribute(dst): dL/dx = W."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import distribute_tensor
    mesh = init_device_mesh(backend.device_type(), case["mesh"])
    x = distribute_tensor(backend.from_host(case["full"]).copy(), mesh, _placements(case["src"]))
    x._local_tensor.requires_grad_()
    y = x.redistribute(mesh, _placements(case["dst"]))
    loss = (y.full_tensor() * backend.from_host(case["weight"])).sum()
    loss.backward()
    return backend.to_host(x.grad.full_tensor().data), x.grad.placements


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_redistribute_backward_is_the_adjoint(world, data):
    case = data.draw(cases(world.world_size))
    full = case["full"]
    if full.dtype.kind != "f":
        return
    for src in (case["src"], case["dst"]):   # max / avg summands: gradients as for sums
        src[:] = [("P", "sum") if p[0] == "P" else p for p in src]
    rng = np.random.default_rng(1)
    case["weight"] = np.asarray(rng.standard_normal(full.shape)).astype(full.dtype)
    for grad, placements in world.run(grad_case, case):
        assert grad.tobytes() == case["weight"].tobytes()   # only data moves backward


def reduce_scatter_grad_case(case):
    """FSDP's pattern: a Shard(0) parameter gathered, each rank's own loss on it; the
    gradient comes back through a reduce-scatter: the sum of every rank's W."""
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh(backend.device_type(), (dist.get_world_size(),))
    x = distribute_tensor(backend.from_host(case["full"]), mesh, [Shard(0)])
    x._local_tensor.requires_grad_()
    w = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    mine = backend.from_host(case["weights"][dist.get_rank()])
    before = dist.get_stats().per_collective.get("reduce_scatter", {}).get("calls", 0)
    (w * mine).sum().backward()
    return (backend.to_host(x.grad.full_tensor().data), x.grad.placements,
            dist.get_stats().per_collective.get("reduce_scatter", {}).get("calls", 0) - before)


@settings(max_examples=4, deadline=None)
@given(rows=st.integers(0, 9), seed=st.integers(0, 99))
def test_gathered_parameter_gradient_is_reduce_scattered(world, rows, seed):
    rng = np.random.default_rng(seed)
    n = world.world_size
    full = rng.standard_normal((rows, 3))
    weights = [rng.standard_normal((rows, 3)) for _ in range(n)]
    expected = np.zeros((rows, 3))
    for w in weights:
        expected = expected + w
    for grad, placements, calls in world.run(reduce_scatter_grad_case,
                                             dict(full=full, weights=weights)):
        np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-12)
        assert [type(p).__name__ for p in placements] == ["Shard"]
        assert calls == (1 if n > 1 and rows else 0)
