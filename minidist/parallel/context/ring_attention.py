"""Context parallelism: ring attention, the sequence split across ranks.

Each of N ranks holds a slice of the sequence: its queries Q_r and its keys and
values K_r, V_r, shaped (..., c, E). Attention of Q_r needs every K_b, V_b, so
the K/V blocks travel around the ring (rank r sends to r+1, receives from r-1)
while each rank folds the block it holds into its result with the logsumexp rule
of flash attention:

    forward, rank r, steps t = 0 .. N-1, block b = (r - t) mod N:
        (O_b, L_b) = flash_forward(Q_r, K_b, V_b)            (the visible part only)
        L   = log(e^L + e^L_b)
        O   = e^(L_old - L) O + e^(L_b - L) O_b             (merge_partial)

The next block's transfer is posted before the compute and waited after it, so
sending overlaps computing. Backward runs the same ring, from the rank's final
(global) O and L and its dO: with those, P = exp(S - L) on any block is that
block's share of the true softmax, so

    dQ_r   += sum over blocks of flash_backward(Q_r, K_b, V_b, O_r, L_r, dO_r).dq
    dK_b, dV_b accumulate on every rank the block visits

and the dK/dV accumulators travel around the ring one step behind their K/V
block, arriving back at their owner after N hops.

With a window or packed documents the ring stops after the last step at which
any rank sees the block it holds (``RingMasks.steps``, S <= N): K/V travel S - 1
hops, and each dK/dV accumulator goes from the last rank it visited straight back
to its owner, S - 1 ranks behind (with S = N that is the next rank, the ring's hop).

Causal load balance (zigzag). With a contiguous split and causal attention,
rank N-1 attends to N blocks and rank 0 to one. Cut the sequence into 2N chunks
and give rank r chunks r and 2N-1-r ("zigzag"). For the block of rank b:

    b == r   local causal attention (the local order is the global order)
    b <  r   both query chunks see all of chunk b, none of chunk 2N-1-b
    b >  r   only query chunk 2N-1-r sees block b, and all of it

so every step after the first costs the same half block on every rank.
``plan_work`` counts it; demos/11_ring_attention.py prints it.

Sliding windows and packed documents (ring_masks.py). Each step's block is cut into
pairs of (query chunk, key chunk), each contiguous in the sequence, and masked by
the global positions of its queries and keys: causal, the window (row i sees keys
i - window + 1 .. i) and the documents (``document_ids`` of the whole sequence, the
same on every rank). A pair that no query sees is skipped: with a window, all but
the chunks just before each query chunk, so the work falls from O(T^2 / 2) to O(T w).
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.attention import common, flash_backward, flash_forward, merge_partial
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.comm.collectives.p2p import post_recv, post_send
from minidist.comm.group import resolve
from minidist.parallel.context.ring_masks import RingMasks, chunks, document_array
from minidist.precision.autocast import autocast_matmul

LAYOUTS = ("zigzag", "contiguous")


# -- where the sequence goes --------------------------------------------------------

def shard_sequence(x: Any, rank: int, world_size: int, layout: str = "zigzag",
                   axis: int = -2) -> Any:
    """The part of the full sequence ``x`` that ``rank`` holds (an array)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    n_chunks = 2 * world_size if layout == "zigzag" else world_size
    length = x.shape[axis]
    if length % n_chunks:
        raise ValueError(f"sequence length {length} is not divisible into {n_chunks} "
                         f"chunks ({layout} layout, world size {world_size})")
    parts = xp.split(x, n_chunks, axis=axis)
    return xp.concatenate([parts[i] for i in chunks(layout, rank, world_size)], axis=axis)


def unshard_sequence(shards: list, layout: str = "zigzag", axis: int = -2) -> Any:
    """Inverse of ``shard_sequence``: the shards of ranks 0..N-1 -> the full sequence."""
    n = len(shards)
    pieces: list = [None] * (2 * n if layout == "zigzag" else n)
    for rank, shard in enumerate(shards):
        ids = chunks(layout, rank, n)
        for i, part in zip(ids, xp.split(shard, len(ids), axis=axis)):
            pieces[i] = part
    return xp.concatenate(pieces, axis=axis)


def plan_work(rank: int, world_size: int, c: int, is_causal: bool = True,
              layout: str = "zigzag", window: int | None = None) -> int:
    """Query-key pairs ``rank`` scores over the whole ring (c = its local length): the
    visible pairs of the chunk pairs it computes (``ring_masks``)."""
    masks = RingMasks(is_causal, window, None, layout, world_size, c)
    return sum(masks.pairs(rank, (rank - step) % world_size) for step in range(world_size))


# -- the ring -------------------------------------------------------------------------

def _ring(group: Any, n_tags: int) -> tuple[int, int, list[int], Any, tuple[int, ...]]:
    """(rank in group, group size, the global rank of each group rank, the group, this
    call's ``n_tags`` tags). The tags come from the group's collective sequence (every
    rank runs the ring in the same order), outside the users' range, so a user's own
    messages on the group are never taken for the ring's (comm/collectives/p2p.py)."""
    g = resolve(group)
    return g.rank, g.size, g.ranks, g, tuple(g.next_collective_tag() for _ in range(n_tags))


def ring_forward(q: Any, k: Any, v: Any, masks: RingMasks, scale: float, group: Any,
                 blocks: dict) -> tuple[Any, Any]:
    """Arrays of this rank -> its (O, L), attending to the K/V of every rank."""
    rank, size, ranks, g, (tag,) = _ring(group, 1)
    nxt, prev = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    e = k.shape[-1]
    out = xp.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
    lse = xp.full(q.shape[:-1], common.NEG_INF, dtype=q.dtype)
    kv = xp.concatenate([k, v], axis=-1)                       # one message: (..., c, E + Ev)
    incoming = xp.empty_like(kv)
    steps = masks.steps()                                       # S <= N: the rest see nothing
    for step in range(steps):
        block = (rank - step) % size
        pending = []
        if step < steps - 1:                                    # next block, while we compute
            pending = [post_send(kv, nxt, g, tag), post_recv(incoming, prev, g, tag)]
        for rows, cols, structure in masks.pieces(rank, block):
            o_b, lse_b = flash_forward(q[..., rows, :], kv[..., cols, :e], kv[..., cols, e:],
                                       structure=structure, scale=scale, **blocks)
            merge_partial(out[..., rows, :], lse[..., rows], o_b, lse_b)
        for handle in pending:
            handle.wait()
        kv, incoming = incoming, kv
    return out, lse


def ring_backward(q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, masks: RingMasks,
                  scale: float, group: Any, blocks: dict) -> tuple[Any, Any, Any]:
    """This rank's (dq, dk, dv) from its O, L and dO; K/V and their gradients ring round
    (the gradients on a tag of their own)."""
    rank, size, ranks, g, (tag, dkv_tag) = _ring(group, 2)
    nxt, prev = ranks[(rank + 1) % size], ranks[(rank - 1) % size]
    e = k.shape[-1]
    dq = xp.zeros_like(q)
    kv = xp.concatenate([k, v], axis=-1)
    incoming = xp.empty_like(kv)
    dkv_in = xp.empty_like(kv)
    sends = []
    steps = masks.steps()
    for step in range(steps):
        block = (rank - step) % size
        pending = []
        if step < steps - 1:
            pending = [post_send(kv, nxt, g, tag), post_recv(incoming, prev, g, tag)]
        dkv = xp.zeros_like(kv)                                 # this rank's part for the block
        for rows, cols, structure in masks.pieces(rank, block):
            dq_b, dk_b, dv_b = flash_backward(
                q[..., rows, :], kv[..., cols, :e], kv[..., cols, e:], out[..., rows, :],
                lse[..., rows], dout[..., rows, :], structure=structure, scale=scale, **blocks)
            dq[..., rows, :] += dq_b
            dkv[..., cols, :e] += dk_b
            dkv[..., cols, e:] += dv_b
        if step > 0:                       # the ranks before us already added their parts
            post_recv(dkv_in, prev, g, dkv_tag).wait()
            dkv += dkv_in
        if steps > 1:                      # on round the ring; after the last step, home
            to = nxt if step < steps - 1 else ranks[block]
            sends.append(post_send(dkv, to, g, dkv_tag))
        for handle in pending:
            handle.wait()
        kv, incoming = incoming, kv
    if steps > 1:                          # our own block, with every rank's part in it
        post_recv(dkv_in, ranks[(rank + steps - 1) % size], g, dkv_tag).wait()
        dkv = dkv_in
    for handle in sends:
        handle.wait()
    return dq, dkv[..., :e].copy(), dkv[..., e:].copy()


class RingAttention(Function):
    """Ring attention as an autograd op: each rank's local q, k, v -> its local output."""

    @staticmethod
    def forward(ctx, q, k, v, masks=None, scale=1.0, group=None, blocks=None):
        blocks = blocks or {}
        out, lse = ring_forward(q, k, v, masks, scale, group, blocks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (masks, scale, group, blocks)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved
        return ring_backward(q, k, v, out, lse, dout, *ctx.options)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                   scale: float | None = None, group: Any = None, layout: str = "zigzag",
                   block_q: int | None = None, block_k: int | None = None,
                   enable_gqa: bool = False, window: int | None = None,
                   document_ids: Any = None) -> Tensor:
    """Attention over the whole sequence, each rank holding its shard of q, k, v.

    q, k, v: (..., c, E), (..., c, E), (..., c, Ev) on every rank of ``group`` (the
    world if None), laid out by ``shard_sequence(x, rank, N, layout)``; returns this
    rank's rows of softmax(scale Q K^T [+ causal]) V. ``layout`` matters only when
    ``is_causal``: "zigzag" balances the work, "contiguous" is the plain split.
    ``window`` (with ``is_causal``): row i sees keys i - window + 1 .. i, by global
    position. ``document_ids``: (T,) or (B, T) integers of the whole sequence
    (T = N c), the same on every rank; a query sees only keys of its own document.
    Every rank must call it, and later its backward, together. Under
    ``precision.autocast`` the inputs, output and gradients are rounded to its format.
    ``enable_gqa``: k and v may have fewer heads than q (grouped-query attention); only
    those heads travel round the ring, and flash attention broadcasts them.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    arrays = [t.data if isinstance(t, Tensor) else t for t in (q, k, v)]
    common.check_qkv(*arrays, enable_gqa=enable_gqa)
    c = arrays[0].shape[-2]
    if arrays[1].shape[-2] != c:
        raise ValueError(f"each rank must hold as many queries as keys, got {c} and "
                         f"{arrays[1].shape[-2]}")
    if (is_causal or document_ids is not None) and layout == "zigzag" and c % 2:
        raise ValueError(f"the zigzag layout holds two equal chunks per rank; local length "
                         f"{c} is odd")
    common.make_structure(arrays[0], arrays[1], is_causal, window, None)  # checks window
    size = dist.get_world_size(group)
    docs = None
    if document_ids is not None:
        batch = arrays[0].shape[0] if arrays[0].ndim >= 4 else 1
        docs = document_array(document_ids, batch, size * c)
    masks = RingMasks(is_causal, window, docs, layout, size, c)
    blocks = {name: size for name, size in (("block_q", block_q), ("block_k", block_k))
              if size is not None}

    def run(q_: Tensor, k_: Tensor, v_: Tensor) -> Tensor:
        return RingAttention.apply(q_, k_, v_, masks=masks,
                                   scale=common.default_scale(arrays[0], scale), group=group,
                                   blocks=blocks)
    return autocast_matmul(run, q, k, v)
