"""The rings of async TP on arrays: one direction, then both (the scaling book's exercise).

Unidirectional (async_tp.py's docstring has the derivation), rank r of N:

    all-gather-matmul     step s = 0 .. N-1: send chunk r-s to r+1 while Y_{r-s} = A_{r-s} @ B
    matmul-reduce-scatter step s = 1 .. N-1: pass the running sum of chunk r+s to r-1 while
                          computing this rank's part of chunk r+s+1; at the end chunk r

Bidirectional: the links are full duplex, so send each chunk both ways at once. With
F = floor(N/2) chunks arriving from the left (r-1, r-2, ..., r-F) and
G = floor((N-1)/2) from the right (r+1, ..., r+G), F + G = N - 1:

    all-gather-matmul     step s = 0 .. F: post  chunk r-s -> r+1 (s < F) and
                          chunk r+s -> r-1 (s < G), while computing the chunks here
                          (A_r at s = 0, A_{r-s} and A_{r+s} after)
    matmul-reduce-scatter chunk c's N parts travel two arcs that meet at rank c: one
                          down from c+G (c+G -> ... -> c+1 -> c, adding each part, c's
                          own included), one up from c-F (not adding c's own):
                          S_c = down_c + up_c

The ring takes max(F, G) = floor(N/2) steps instead of N-1, each moving the same bytes
on each link; the wire time halves, the transfers overlap half as many matmuls. The
gathered A and the all-gather's products are the unidirectional ring's, bit for bit
(each chunk's product is the same, summed in rank order); the reduce-scatter adds in
another order: equal to float tolerance.

In a trace, each step's transfers are a span on a row of their own ("async TP ring
(chunks in flight)", from the step's post to the end of its wait), so the summary counts
what the products hid as hidden and the waits as exposed.

Tags: each call takes two from the group's collective sequence (``next_collective_tag``,
every rank in the same order), outside the users' range, so a user's own messages are
never taken for the ring's (comm/collectives/p2p.py ``post_send``).
Tests: tests/parallel/tensor/test_async_tp.py.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from minidist.backend import xp
from minidist.comm.collectives.check import describe, verify_same_call
from minidist.comm.collectives.p2p import post_recv, post_send
from minidist.comm.errors import CollectiveMismatchError
from minidist.comm.group import ProcessGroup, resolve
from minidist.trace import recorder as trace


class Ring(NamedTuple):
    """One call's ring over a group."""
    group: ProcessGroup
    rank: int            # this rank's place in the group
    size: int            # N
    nxt: int             # the global rank of r+1
    prev: int            # ... of r-1
    tags: tuple          # (to r+1, to r-1): this call's two tags


def open_ring(group: Any, name: str, shape: tuple, dtype: Any, **fields: Any) -> Ring:
    """The ring of this call, after checking that every rank called ``name`` on a shard
    of the same shape (the same-call check of every collective): a rank with a shorter
    sequence is refused on every rank, not left to mismatch mid-ring."""
    g = resolve(group)
    if g.check and g.size > 1:
        line = describe(name, shape=tuple(shape), dtype=xp.dtype(dtype).name, **fields)
        try:
            verify_same_call(g, line, g.next_collective_tag())
        except CollectiveMismatchError as e:
            raise ValueError(f"{name}: the ranks' calls differ ({e}); every rank must hold an "
                             f"equal shard: pad the sequence to a multiple of the group "
                             f"size {g.size}") from e
    r, n = g.rank, g.size
    return Ring(g, r, n, g.ranks[(r + 1) % n], g.ranks[(r - 1) % n],
                (g.next_collective_tag(), g.next_collective_tag()))


def exchange(ring: Ring, out: Any, incoming: Any, forward: bool) -> list:
    """Post: send ``out`` one way round (``forward``: to r+1), receive ``incoming`` from
    the other side; the handles to wait on."""
    to, frm = (ring.nxt, ring.prev) if forward else (ring.prev, ring.nxt)
    tag = ring.tags[0 if forward else 1]
    return [post_send(out, to, ring.group, tag), post_recv(incoming, frm, ring.group, tag)]


def axis(dim: int, ndim: int, what: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}={dim} is not an axis of a {ndim}-d tensor")
    return dim % ndim


def chunk_length(length: int, n: int, dim: int, what: str) -> int:
    """The length of each of n equal chunks, or a clear refusal."""
    if length % n:
        raise ValueError(f"{what}: axis {dim} of length {length} does not split into {n} "
                         f"equal chunks, one per rank of the ring; pad it to a multiple of {n}")
    return length // n


def matmul(a: Any, b: Any) -> Any:
    """(..., K) @ (K, N) -> (..., N), the leading axes folded into one (as nn.Linear)."""
    out = xp.matmul(a.reshape(-1, a.shape[-1]), b)                    # (M, N)
    return out.reshape(*a.shape[:-1], b.shape[-1])


def take(x: Any, dim: int, index: int, length: int) -> Any:
    """Chunk ``index`` (of ``length`` along ``dim``) of ``x``, contiguous."""
    where = [slice(None)] * x.ndim
    where[dim] = slice(index * length, (index + 1) * length)
    return xp.ascontiguousarray(x[tuple(where)])


def sum_in_order(parts: list) -> Any:
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


def ring_all_gather_matmul(a_shard: Any, bs: list, gather_dim: int, group: Any = None,
                           bidirectional: bool = False) -> tuple[Any, list]:
    """Arrays: (AG(a_shard) along gather_dim, [AG(a_shard) @ b for b in bs]), as a ring."""
    dim = axis(gather_dim, a_shard.ndim, "gather_dim")
    contract = dim == a_shard.ndim - 1           # gathering K: the products are summands
    k, n = a_shard.shape[-1], resolve(group).size
    for b in bs:
        if b.shape[0] != (n * k if contract else k):
            raise ValueError(f"fused_all_gather_matmul: B of shape {tuple(b.shape)} does not "
                             f"multiply the gathered A (last axis {n * k if contract else k})")
    ring = open_ring(group, "fused_all_gather_matmul", a_shard.shape, a_shard.dtype, dim=dim,
                     bs=[tuple(b.shape) for b in bs], bidirectional=bidirectional)
    chunks, products = [None] * n, [[None] * n for _ in bs]
    chunks[ring.rank] = xp.ascontiguousarray(a_shard)

    def compute(c: int) -> None:                 # chunk c's products, while others travel
        for i, b in enumerate(bs):
            rows = b[c * k:(c + 1) * k] if contract else b
            products[i][c] = matmul(chunks[c], rows)             # (..., shard, ..., N)
    left, right = (n // 2, (n - 1) // 2) if bidirectional else (n - 1, 0)
    for step in range(left + 1):
        r = ring.rank
        arriving = {}                            # chunk index -> its buffer, landing now
        posted = trace.active.now() if trace.active is not None and step < left else None
        pending = _post_chunks(ring, chunks, arriving, step, left, right)
        for c in sorted({(r - step) % n, (r + step) % n} if step <= right else {(r - step) % n}):
            compute(c)
        for handle in pending:
            handle.wait()
        in_flight(posted, step)
        for c, buf in arriving.items():
            chunks[c] = buf
    a_full = xp.concatenate(chunks, axis=dim)
    if contract:                                 # sum in rank order: the same on every rank
        return a_full, [sum_in_order(p) for p in products]
    return a_full, [xp.concatenate(p, axis=dim) for p in products]


def _post_chunks(ring: Ring, chunks: list, arriving: dict, step: int, left: int,
                 right: int) -> list:
    """Step ``step``'s transfers: chunk r-step on to r+1 (while step < left) and chunk
    r+step on to r-1 (while step < right); their buffers into ``arriving``."""
    r, n, pending = ring.rank, ring.size, []
    if step < left:
        c = (r - step) % n
        arriving[(c - 1) % n] = xp.empty_like(chunks[c])
        pending += exchange(ring, chunks[c], arriving[(c - 1) % n], forward=True)
    if step < right:
        c = (r + step) % n
        arriving[(c + 1) % n] = xp.empty_like(chunks[c])
        pending += exchange(ring, chunks[c], arriving[(c + 1) % n], forward=False)
    return pending


def ring_matmul_reduce_scatter(a: Any, b: Any, scatter_dim: int, group: Any = None,
                               plus: Any = None, bidirectional: bool = False) -> Any:
    """Array: the sum over ranks of chunk r of ``a @ b (+ plus)`` along scatter_dim, as a ring."""
    dim = axis(scatter_dim, a.ndim, "scatter_dim")
    columns = dim == a.ndim - 1                  # scattering N: cut B's columns
    n = resolve(group).size
    size = chunk_length(b.shape[1] if columns else a.shape[dim], n, dim,
                        "fused_matmul_reduce_scatter")
    ring = open_ring(group, "fused_matmul_reduce_scatter", a.shape, a.dtype, dim=dim,
                     b=tuple(b.shape), bidirectional=bidirectional)

    def part(c: int) -> Any:                     # this rank's summand of chunk c
        c %= n
        if columns:
            out = matmul(a, b[:, c * size:(c + 1) * size])
        else:
            out = matmul(take(a, dim, c, size), b)
        return out if plus is None else out + take(plus, dim, c, size)
    if not bidirectional:                        # one arc of N-1 hops, going back
        return _arcs(ring, part, [Arc(n - 1, False, True)])
    return _arcs(ring, part, [Arc((n - 1) // 2, False, True), Arc(n // 2, True, False)])


class Arc(NamedTuple):
    """One direction of a reduce-scatter ring: chunk r's running sum reaches this rank
    after ``hops`` steps, from the ranks behind it (r-1, ... going forward; r+1, ...
    going back), plus this rank's own part of chunk r if ``own``."""
    hops: int
    forward: bool
    own: bool

    def chunk(self, r: int, step: int) -> int:
        """The chunk whose running sum this rank holds after ``step`` steps."""
        return r + (1 if self.forward else -1) * (self.hops - step)


def _arcs(ring: Ring, part: Any, arcs: list) -> Any:
    """Run the arcs side by side, one step of each at a time (both links busy at once);
    the sum of their totals: this rank's chunk r."""
    r = ring.rank
    totals = [part(a.chunk(r, 0)) if (a.hops or a.own) else None for a in arcs]
    for step in range(1, max(a.hops for a in arcs) + 1):
        posted = trace.active.now() if trace.active is not None else None
        moving = [k for k, a in enumerate(arcs) if step <= a.hops]
        incoming, pending = {}, []
        for k in moving:
            incoming[k] = xp.empty_like(totals[k])
            pending += exchange(ring, totals[k], incoming[k], arcs[k].forward)
        mine = {k: part(arcs[k].chunk(r, step))                         # while they travel
                for k in moving if arcs[k].own or step < arcs[k].hops}
        for handle in pending:
            handle.wait()
        in_flight(posted, step)
        for k in moving:
            totals[k] = incoming[k] + mine[k] if k in mine else incoming[k]
    total = None
    for t in totals:
        if t is not None:
            total = t if total is None else total + t
    return total


TRACK = "async TP ring (chunks in flight)"   # the trace row of the rings' transfers


def in_flight(posted: float | None, step: int) -> None:
    """While tracing: the step's transfers, from their post to the end of their wait, as
    a span of cat "comm" on a row of its own: the summary counts the part of it that
    the products hid as hidden, the waits on the main thread as exposed."""
    if posted is not None and trace.active is not None:
        trace.active.span(f"ring step {step}", "comm", posted, trace.active.now(),
                          tid=trace.active.tid(TRACK))
