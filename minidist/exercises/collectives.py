"""35.1 collectives from send/recv, and 35.2 ring all-reduce, graded on real processes.

Each property starts a world of N ranks (N drawn by hypothesis, 1 to 4), gives
rank r its own input, runs the learner's function there, and compares what
comes back with the sum (or concatenation) computed here. A learner's receive
that waits for a message that never comes is stopped by the world's timeout.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property

world_sizes = st.integers(1, 4)
# numbers whose sum depends on the order of the additions (0.1 + 0.2 + 0.3 ...)
awkward = st.sampled_from([0.1, 0.2, 0.3, 1.0, -1.0, 3.0, 1e16, -1e16, 2.5e-8])


def per_rank(draw_values, n: int, count: int) -> list[np.ndarray]:
    return [np.array(draw_values[r * count:(r + 1) * count], dtype=np.float64) for r in range(n)]


inputs = st.integers(1, 4).flatmap(lambda n: st.integers(0, 9).flatmap(
    lambda c: st.tuples(st.just(n), st.just(c), st.lists(awkward, min_size=n * c, max_size=n * c))))


def drive(module, name: str, inputs: list) -> tuple:
    """In rank r: call ``module.name`` on input r; return its result and bytes sent."""
    from minidist.backend import from_host, to_host
    from minidist.comm import get_rank
    from minidist.comm.group import get_stats
    before = get_stats().bytes_sent
    out = getattr(module, name)(from_host(inputs[get_rank()]))
    assert out is not None, f"{name} returned None: return the result array"
    return to_host(out), get_stats().bytes_sent - before


def _run(s, name, n, xs):
    results = s.run(n, drive, name, xs)
    return [r[0] for r in results], [r[1] for r in results]


def _same_bits_everywhere(outs: list, what: str) -> None:
    for r, out in enumerate(outs[1:], 1):
        assert out.shape == outs[0].shape and out.tobytes() == outs[0].tobytes(), \
            f"{what}: rank {r} holds {out.tolist()}, rank 0 holds {outs[0].tolist()} " \
            "(every rank must end with the same bits)"


def _sum_matches(outs: list, xs: list, what: str) -> None:
    want = np.sum(xs, axis=0) if xs[0].size else xs[0]
    for r, out in enumerate(outs):
        assert out.shape == want.shape, f"{what}: rank {r} returned shape {out.shape}, expected {want.shape}"
        assert np.allclose(out, want, rtol=1e-12, atol=1e-6), \
            f"{what}: rank {r} holds {out.tolist()}, the sum is {want.tolist()}"


# -- 35.1 -----------------------------------------------------------------------------

def _all_reduce_sums(s, case):
    n, c, values = case
    xs = per_rank(values, n, c)
    outs, _ = _run(s, "all_reduce", n, xs)
    _sum_matches(outs, xs, "all_reduce")
    _same_bits_everywhere(outs, "all_reduce")


def _all_gather_concatenates(s, case):
    n, c, values = case
    xs = per_rank(values, n, c)
    outs, _ = _run(s, "all_gather", n, xs)
    want = np.concatenate(xs)
    for r, out in enumerate(outs):
        assert out.tolist() == want.tolist(), \
            f"all_gather: rank {r} holds {out.tolist()}, expected {want.tolist()}"


def _reduce_scatter_chunks(s, case):
    n, c, values = case
    xs = [np.resize(np.array(values or [0.0], dtype=np.float64), c * n) * (r + 1) for r in range(n)]
    outs, _ = _run(s, "reduce_scatter", n, xs)
    total = np.sum(xs, axis=0)
    for r, out in enumerate(outs):
        want = total[r * c:(r + 1) * c]
        assert out.shape == want.shape and np.allclose(out, want, rtol=1e-12, atol=1e-6), \
            f"reduce_scatter: rank {r} holds {out.tolist()}, expected chunk {r} of the sum: {want.tolist()}"


COLLECTIVES = Exercise(
    id="35.1", processes=True, title="collectives from send/recv", kind="implement",
    filename="ex_35_1_collectives.py",
    docs="docs/collectives.md",
    starter='''"""Exercise 35.1: collective operations from point-to-point messages.

Implement all-reduce, all-gather and reduce-scatter using only send and
receive. Every rank calls the same function with its own array.

    all_reduce(x)      -> sum over ranks of x, the same bits on every rank
    all_gather(x)      -> concatenation [x_0, x_1, ..., x_{N-1}] (1-D arrays)
    reduce_scatter(x)  -> chunk r of the sum, on rank r (x has N equal chunks)

Interface you may use (minidist.comm): get_rank(), get_world_size(),
send(array, dst), recv(array, src) (recv fills a preallocated array of the
sender's shape and dtype), isend / irecv (return a handle: .wait()).
Arrays: xp from minidist.backend (NumPy here). Not allowed: the collectives of
minidist.comm themselves.

The hard part: the sum of floats depends on the order of the additions, and
all ranks must end with the same bits. Check: `minidist exercise check 35.1`.
"""
from minidist.backend import xp
from minidist.comm import get_rank, get_world_size, irecv, isend, recv, send


def all_reduce(x):
    raise NotImplementedError


def all_gather(x):
    raise NotImplementedError


def reduce_scatter(x):
    raise NotImplementedError
''',
    properties=[
        Property("all_reduce: every rank holds the sum, with the same bits", _all_reduce_sums,
                 dict(case=inputs), examples=10,
                 hint="docs/collectives.md: reduce in one order on one rank (or one order "
                      "per chunk), then copy the result; never let each rank add in its own order"),
        Property("all_gather: every rank holds the concatenation in rank order",
                 _all_gather_concatenates, dict(case=inputs), examples=8,
                 hint="place rank r's array at offset r * len(x), whatever order messages arrive in"),
        Property("reduce_scatter: rank r holds chunk r of the sum", _reduce_scatter_chunks,
                 dict(case=inputs), examples=8,
                 hint="chunk r is x[r*k:(r+1)*k] with k = len(x) // N; docs/collectives.md"),
    ],
    solution='''from minidist.backend import xp
import minidist.comm as comm


def all_reduce(x):
    comm.all_reduce(x)
    return x


def all_gather(x):
    out = xp.empty(x.size * comm.get_world_size(), dtype=x.dtype)
    comm.all_gather_into_tensor(out, x)
    return out


def reduce_scatter(x):
    out = xp.empty(x.size // comm.get_world_size(), dtype=x.dtype)
    comm.reduce_scatter_tensor(out, x)
    return out
''',
    wrong={
        "each rank adds in its own order": '''from minidist.backend import xp
from minidist.comm import get_rank, get_world_size, irecv, isend


def _everyone(x):
    n, r = get_world_size(), get_rank()
    parts = [None] * n
    parts[r] = x.copy()
    sends = [isend(x, d) for d in range(n) if d != r]
    for src in range(n):
        if src != r:
            parts[src] = xp.empty_like(x)
            irecv(parts[src], src).wait()
    for h in sends:
        h.wait()
    return parts


def all_reduce(x):
    parts = _everyone(x)
    r = get_rank()
    total = parts[r].copy()
    for i, p in enumerate(parts):
        if i != r:
            total += p
    return total


def all_gather(x):
    return xp.concatenate(_everyone(x))


def reduce_scatter(x):
    n, r = get_world_size(), get_rank()
    k = x.size // n
    return sum(p[r * k:(r + 1) * k] for p in _everyone(x))
''',
        "chunks off by one": '''from minidist.backend import xp
import minidist.comm as comm


def all_reduce(x):
    comm.all_reduce(x)
    return x


def all_gather(x):
    out = xp.empty(x.size * comm.get_world_size(), dtype=x.dtype)
    comm.all_gather_into_tensor(out, x)
    return out


def reduce_scatter(x):
    comm.all_reduce(x)
    n, r = comm.get_world_size(), comm.get_rank()
    k = x.size // n
    return x[r * k + 1:(r + 1) * k + 1]
''',
    })


# -- 35.2 -----------------------------------------------------------------------------

def _chunk_bounds_partition(s, count, n):
    bounds = [tuple(b) for b in s.chunk_bounds(count, n)]
    assert len(bounds) == n, f"chunk_bounds({count}, {n}) gave {len(bounds)} chunks, expected {n}"
    edges = [0] + [hi for _, hi in bounds]
    assert [lo for lo, _ in bounds] == edges[:-1] and edges[-1] == count, \
        f"chunk_bounds({count}, {n}) = {bounds}: chunks must be contiguous and cover [0, {count})"
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1, f"chunk_bounds({count}, {n}) = {bounds}: sizes differ by more than one"


def _ring_sums(s, case):
    n, c, values = case
    xs = per_rank(values, n, c)
    outs, _ = _run(s, "ring_all_reduce", n, xs)
    _sum_matches(outs, xs, "ring_all_reduce")
    _same_bits_everywhere(outs, "ring_all_reduce")


def _ring_volume(s, n, count):
    xs = [np.full(count, float(r + 1)) for r in range(n)]
    _, sent = _run(s, "ring_all_reduce", n, xs)
    m = count * 8
    want = 2 * (n - 1) / n * m
    slack = 2 * (n - 1) * 8    # one element per step, when N does not divide the count
    for r, b in enumerate(sent):
        assert abs(b - want) <= slack, \
            f"rank {r} sent {b} bytes for M = {m} bytes on {n} ranks; a ring sends " \
            f"2(N-1)/N * M = {want:.0f}"


RING = Exercise(
    id="35.2", processes=True, title="ring all-reduce", kind="implement",
    filename="ex_35_2_ring_all_reduce.py",
    docs="docs/collectives.md (ring all-reduce)",
    starter='''"""Exercise 35.2: ring all-reduce.

Implement the ring all-reduce for N processes. The ranks form a ring: rank r
sends only to (r+1) % N and receives only from (r-1) % N. The flat array is
cut into N contiguous chunks whose sizes differ by at most one element.

    reduce-scatter, N-1 steps: in step s send chunk (r-s) mod N to the right,
        receive chunk (r-s-1) mod N from the left and add it to your copy
    all-gather, N-1 steps: forward the finished chunks around the ring
    bytes sent per rank: 2(N-1)/N * M (the bandwidth optimum)

Interface (minidist.comm): get_rank(), get_world_size(), send, recv, isend,
irecv (a handle with .wait()). Post the receive before waiting on the send,
or two neighbours that both send first can wait for each other. Arrays: xp
from minidist.backend.

Check: `minidist exercise check 35.2`.
"""
from minidist.backend import xp
from minidist.comm import get_rank, get_world_size, irecv, isend, recv, send


def chunk_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """n contiguous (start, stop) pairs covering range(count), sizes within one."""
    raise NotImplementedError


def ring_all_reduce(x):
    """Sum of x over all ranks, on every rank (x is 1-D; return the result)."""
    raise NotImplementedError
''',
    properties=[
        Property("chunk_bounds: N contiguous chunks covering the array, sizes within one",
                 _chunk_bounds_partition, dict(count=st.integers(0, 100), n=st.integers(1, 16)),
                 examples=30, hint="what happens to the remainder when N does not divide the count?"),
        Property("every rank holds the sum, with the same bits", _ring_sums,
                 dict(case=inputs), examples=10,
                 explicit=[dict(case=(4, 1, [0.1, 0.2, 0.3, 3.0]))],
                 hint="docs/collectives.md, ring all-reduce: each chunk is finished on one rank, "
                      "then copied, so all ranks hold the same bits"),
        Property("each rank sends 2(N-1)/N * M bytes", _ring_volume,
                 dict(n=world_sizes, count=st.integers(1, 40)), examples=6,
                 hint="a ring step moves one chunk (M/N), 2(N-1) steps in all"),
    ],
    solution='''from minidist.comm.collectives.ring import chunk_bounds, ring_all_gather, ring_reduce_scatter
from minidist.comm.group import world_group
from minidist.comm.transport.reduce_op import ReduceOp


def ring_all_reduce(x):
    group = world_group()
    bounds = chunk_bounds(x.size, group.size)
    tag = group.next_collective_tag()
    ring_reduce_scatter(group, x, bounds, ReduceOp.SUM, tag)
    ring_all_gather(group, x, bounds, tag)
    return x
''',
    wrong={
        "remainder dropped": '''from minidist.comm.collectives.ring import ring_all_gather, ring_reduce_scatter
from minidist.comm.group import world_group
from minidist.comm.transport.reduce_op import ReduceOp


def chunk_bounds(count, n):
    k = count // n
    return [(i * k, (i + 1) * k) for i in range(n)]


def ring_all_reduce(x):
    group = world_group()
    bounds = chunk_bounds(x.size, group.size)
    tag = group.next_collective_tag()
    ring_reduce_scatter(group, x, bounds, ReduceOp.SUM, tag)
    ring_all_gather(group, x, bounds, tag)
    return x
''',
        "reduce to rank 0 and broadcast": '''from minidist.backend import xp
from minidist.comm import get_rank, get_world_size, recv, send


def chunk_bounds(count, n):
    edges = [i * count // n for i in range(n + 1)]
    return list(zip(edges[:-1], edges[1:]))


def ring_all_reduce(x):
    n, r = get_world_size(), get_rank()
    if r == 0:
        for src in range(1, n):
            part = xp.empty_like(x)
            recv(part, src)
            x += part
        for dst in range(1, n):
            send(x, dst)
    else:
        send(x, 0)
        recv(x, 0)
    return x
''',
        "receives from the wrong neighbour (hangs)": '''from minidist.backend import xp
from minidist.comm import get_rank, get_world_size, irecv, isend


def chunk_bounds(count, n):
    edges = [i * count // n for i in range(n + 1)]
    return list(zip(edges[:-1], edges[1:]))


def ring_all_reduce(x):
    n, r = get_world_size(), get_rank()
    bounds = chunk_bounds(x.size, n)
    for s in range(n - 1):
        lo, hi = bounds[(r - s) % n]
        rlo, rhi = bounds[(r - s - 1) % n]
        inbox = xp.empty(rhi - rlo)
        h = isend(x[lo:hi].copy(), (r + 1) % n)
        irecv(inbox, (r + 2) % n).wait()
        h.wait()
        x[rlo:rhi] += inbox
    return x
''',
    })

EXERCISES = [COLLECTIVES, RING]
