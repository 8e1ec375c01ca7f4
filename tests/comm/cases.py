"""Collective test cases shared by the local tests and the MPI script.

A case is a plain dict (collective, world size, shape, dtype, op, algorithm,
root, seed). ``run_case`` runs it on a rank of an initialised world and returns
this rank's result as host arrays; ``expected`` computes, with NumPy in one
process, what every rank must return. Inputs are regenerated from the seed on
each rank, so only the small case dict travels.

Values are small integers (-2..2, 0..2 for unsigned types) so that any order
of additions or multiplications gives exactly the same result: the oracle can
demand equality, bit for bit, from every algorithm. ``real=True`` draws normal
floats instead, to check that all ranks agree bitwise when order matters.
"""
import numpy as np

import minidist.distributed as dist
from minidist import backend

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
               "barrier")
DTYPES = ("float16", "float32", "float64", "int8", "int32", "int64", "uint8")
OPS = ("SUM", "AVG", "MAX", "MIN", "PROD")
ALGORITHMS = ("ring", "tree", "recursive_doubling", "naive", "allgather", "direct", "auto")
if backend.get_backend() == "cupy":  # "direct" reads peers' host memory, not device arrays
    ALGORITHMS = tuple(a for a in ALGORITHMS if a != "direct")
UFUNC = {"SUM": np.add, "AVG": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}


# -- inputs ------------------------------------------------------------------

def values(rng, shape, dtype, real=False):
    dtype = np.dtype(dtype)
    if real and dtype.kind == "f":
        return np.asarray(rng.standard_normal(shape), dtype=dtype)
    low = 0 if dtype.kind == "u" else -2
    return np.asarray(rng.integers(low, 3, size=shape), dtype=dtype)


def inputs(case, rank):
    """What ``rank`` holds before the collective (host arrays)."""
    rng = np.random.default_rng(case["seed"] * 1009 + rank)
    shape, dtype, n, real = tuple(case["shape"]), case["dtype"], case["world"], case.get("real")
    name = case["collective"]
    if name in ("reduce_scatter", "scatter"):
        return [values(rng, shape, dtype, real) for _ in range(n)]
    if name == "reduce_scatter_tensor":
        return values(rng, (n * int(np.prod(shape)),), dtype, real)
    if name == "all_to_all":  # part sizes differ from pair to pair
        return [values(rng, (_part_len(case, rank, dst),), dtype, real) for dst in range(n)]
    return values(rng, shape, dtype, real)


def _part_len(case, src, dst):
    return (case["seed"] + 3 * src + 5 * dst) % (int(np.prod(case["shape"])) + 2)


# -- the oracle --------------------------------------------------------------

def reduce_all(arrays, op, n):
    acc = arrays[0].copy()
    for a in arrays[1:]:
        UFUNC[op](acc, a, out=acc)
    if op == "AVG":
        if acc.dtype.kind == "f":
            np.divide(acc, n, out=acc)
        else:
            np.floor_divide(acc, n, out=acc)
    return acc


def expected(case):
    """Per-rank results as the single-process NumPy reference computes them."""
    n, name, root, op = case["world"], case["collective"], case.get("root", 0), case.get("op")
    xs = [inputs(case, r) for r in range(n)]
    if name == "all_reduce":
        return [reduce_all(xs, op, n)] * n
    if name == "broadcast":
        return [xs[root]] * n
    if name == "reduce":
        return [reduce_all(xs, op, n) if r == root else xs[r] for r in range(n)]
    if name in ("all_gather",):
        return [list(xs)] * n
    if name == "all_gather_into_tensor":
        return [np.concatenate([x.reshape(-1) for x in xs])] * n
    if name == "reduce_scatter":
        return [reduce_all([xs[s][r] for s in range(n)], op, n) for r in range(n)]
    if name == "reduce_scatter_tensor":
        total = reduce_all(xs, op, n)
        return list(np.split(total, n))
    if name == "gather":
        return [list(xs) if r == root else None for r in range(n)]
    if name == "scatter":
        return [xs[root][r] for r in range(n)]
    if name == "all_to_all":
        return [[xs[s][r] for s in range(n)] for r in range(n)]
    if name == "barrier":
        return [None] * n
    raise ValueError(name)


# -- one rank's side ------------------------------------------------------------

def _dev(a):
    return backend.from_host(a)


def _host(a):
    return backend.to_host(a).copy()


def run_case(case):
    """Run ``case`` on this rank of an initialised world; return host results."""
    rank, n = dist.get_rank(), dist.get_world_size()
    assert n == case["world"], (n, case["world"])
    name, root = case["collective"], case.get("root", 0)
    op = getattr(dist.ReduceOp, case.get("op") or "SUM")
    x = inputs(case, rank)
    if name == "all_reduce":
        t = _dev(x)
        dist.all_reduce(t, op=op, algorithm=case.get("algorithm", "auto"))
        return _host(t)
    if name == "broadcast":
        t = _dev(x)
        dist.broadcast(t, src=root)
        return _host(t)
    if name == "reduce":
        t = _dev(x)
        dist.reduce(t, dst=root, op=op)
        return _host(t)
    if name == "all_gather":
        outs = [backend.xp.zeros(x.shape, dtype=x.dtype) for _ in range(n)]
        dist.all_gather(outs, _dev(x))
        return [_host(o) for o in outs]
    if name == "all_gather_into_tensor":
        out = backend.xp.zeros(n * x.size, dtype=x.dtype)
        dist.all_gather_into_tensor(out, _dev(x))
        return _host(out)
    if name == "reduce_scatter":
        out = backend.xp.zeros(x[0].shape, dtype=x[0].dtype)
        dist.reduce_scatter(out, [_dev(a) for a in x], op=op)
        return _host(out)
    if name == "reduce_scatter_tensor":
        out = backend.xp.zeros(x.size // n, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, _dev(x), op=op)
        return _host(out)
    if name == "gather":
        outs = [backend.xp.zeros(x.shape, dtype=x.dtype) for _ in range(n)] if rank == root else None
        dist.gather(_dev(x), outs, dst=root)
        return [_host(o) for o in outs] if rank == root else None
    if name == "scatter":
        t = backend.xp.zeros(x[0].shape, dtype=x[0].dtype)
        dist.scatter(t, [_dev(a) for a in x] if rank == root else None, src=root)
        return _host(t)
    if name == "all_to_all":
        outs = [backend.xp.zeros(_part_len(case, s, rank), dtype=case["dtype"]) for s in range(n)]
        dist.all_to_all(outs, [_dev(a) for a in x])
        return [_host(o) for o in outs]
    if name == "barrier":
        dist.barrier()
        return None
    raise ValueError(name)


def run_cases(cases):
    return [run_case(c) for c in cases]


def same(a, b):
    """Equal shapes, dtypes and bits (None == None; lists elementwise)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def close(a, b):
    """Equal up to float rounding (for real-valued inputs summed in another order)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    tol = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}.get(a.dtype.name, 0)
    return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol * 8)


def random_case(rng, world, collective=None):
    """A random case, drawn with a NumPy generator (the MPI script uses this)."""
    name = collective or COLLECTIVES[rng.integers(len(COLLECTIVES))]
    ndim = int(rng.integers(0, 3))
    shape = tuple(int(s) for s in rng.integers(0, 6, size=ndim))
    if rng.random() < 0.2:
        shape = (int(rng.integers(1000, 6000)),)
    dtype = DTYPES[rng.integers(len(DTYPES))]
    case = dict(collective=name, world=world, shape=shape, dtype=dtype,
                op=OPS[rng.integers(len(OPS))], algorithm=ALGORITHMS[rng.integers(len(ALGORITHMS))],
                root=int(rng.integers(world)), seed=int(rng.integers(1 << 30)))
    if name == "all_reduce" and np.dtype(dtype).kind == "f" and rng.random() < 0.3:
        case.update(real=True, op="SUM")
    return case


# -- a peer that never comes -------------------------------------------------

def rank_2_never_comes(collective):
    """Rank 2 sleeps past the world's timeout; the others call ``collective``
    (all_reduce, all_to_all_single, send) on 3 elements, and must time out."""
    import time
    from minidist.backend import xp
    if dist.get_rank() == 2:
        time.sleep(30)
    elif collective == "all_reduce":
        dist.all_reduce(xp.ones(3))
    elif collective == "all_to_all_single":
        dist.all_to_all_single(xp.zeros(3), xp.ones(3))
    elif dist.get_rank() == 0:      # "send": rank 0's message waits for a receive
        dist.recv(xp.ones(3), src=2)


def named_within_the_timeout(collective):
    """Run ``rank_2_never_comes`` in a world of 3 with a 2 s timeout: the
    RankFailedError of a rank that waited (its traceback names rank 2)."""
    import pytest
    from minidist.comm import RankFailedError, World
    with World(3, timeout=2.0, run_timeout=60.0) as world:
        with pytest.raises(RankFailedError) as info:
            world.run(rank_2_never_comes, collective)
    err = info.value
    assert err.exc_type == "CommTimeoutError", err.remote_traceback
    return err
