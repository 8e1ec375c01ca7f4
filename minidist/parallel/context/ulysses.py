"""Ulysses sequence parallelism: all-to-all from sequence shards to head shards and back.

DeepSpeed-Ulysses (Jacobs et al., 2023). Each of N ranks holds a contiguous 1/N of
the sequence for all H heads: q, k, v of shape (B, H, s/N, D). Attention needs the
whole sequence, but each head is independent, so one all-to-all regroups the data:
rank r sends heads j*H/N .. (j+1)*H/N - 1 of its positions to rank j, and receives
its own head group for every position:

    (B, H, s/N, D)  --all-to-all-->  (B, H/N, s, D)       q, k and v: 3 all-to-alls
    attention (naive or flash, causal or not) on H/N heads over the full sequence
    (B, H/N, s, D)  --all-to-all-->  (B, H, s/N, D)       the output: 1 all-to-all

Backward mirrors it: the gradient of a sequence-to-heads all-to-all is the
heads-to-sequence one, and the other way round (the two are inverse permutations).

Bytes each rank sends, with M = B * H * (s/N) * D * itemsize its share of one of q, k,
v or o:  forward 4 * (N-1)/N * M, backward the same. Ring attention instead sends its
K and V blocks round the ring, 2 * (N-1) * M in forward: Ulysses moves N/2 times less
per rank, and its volume per rank shrinks as N grows (calc: ``minidist calc
sequence-parallel``). Its limit: N must divide the number of heads (and each rank
then computes full-sequence attention for H/N heads); ring attention has no such limit.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.attention import flash_attention, naive_attention
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp


def split_sequence(x: Any, rank: int, world_size: int, axis: int = -2) -> Any:
    """Rank ``rank``'s contiguous 1/N of the sequence axis of ``x`` (an array)."""
    length = x.shape[axis]
    if length % world_size:
        raise ValueError(f"Ulysses needs the sequence length ({length}) divisible by the "
                         f"group size ({world_size}); pad the sequence, or use ring "
                         f"attention (minidist.parallel.ring_attention), which takes any "
                         f"split")
    return xp.ascontiguousarray(xp.split(x, world_size, axis=axis)[rank])


def _seq_to_heads(x: Any, group: Any) -> Any:
    """(B, H, c, D) sequence shard -> (B, H/N, N*c, D) head shard over the full sequence."""
    n = dist.get_world_size(group)
    B, H, c, D = x.shape
    send = xp.ascontiguousarray(x.reshape(B, n, H // n, c, D).transpose(1, 0, 2, 3, 4))
    recv = xp.empty_like(send)                       # (N, B, H/N, c, D): chunk i from rank i
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(1, 2, 0, 3, 4).reshape(B, H // n, n * c, D)


def _heads_to_seq(y: Any, group: Any) -> Any:
    """(B, H/N, N*c, D) head shard -> (B, H, c, D) sequence shard (inverse of the above)."""
    n = dist.get_world_size(group)
    B, h, s, D = y.shape
    send = xp.ascontiguousarray(y.reshape(B, h, n, s // n, D).transpose(2, 0, 1, 3, 4))
    recv = xp.empty_like(send)                       # (N, B, H/N, c, D): head group i
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(1, 0, 2, 3, 4).reshape(B, n * h, s // n, D)


class Regroup(Function):
    """``to_heads``: sequence shards -> head shards, else the reverse. The two are inverse
    permutations of the same data, so the backward of one is the forward of the other."""

    @staticmethod
    def forward(ctx, x, to_heads, group):
        ctx.to_heads, ctx.group = to_heads, group
        return _seq_to_heads(x, group) if to_heads else _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        back = _heads_to_seq(grad, ctx.group) if ctx.to_heads else _seq_to_heads(grad, ctx.group)
        return back, None, None


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                      group: Any = None, impl: str = "naive", scale: float | None = None,
                      enable_gqa: bool = False, window: int | None = None,
                      document_ids: Any = None, **blocks: int) -> Tensor:
    """Attention over a sequence split contiguously over ``group``: q, k, v are this
    rank's (B, H, s/N, D) shards (``split_sequence``); returns its (B, H, s/N, D) shard
    of softmax(q k^T / sqrt(D)) v. ``impl``: "naive" or "flash" (``blocks``: block_q,
    block_k). Equal to one-process attention (tests/parallel/context/).

    ``enable_gqa``: k and v hold Hkv < H heads (grouped-query attention); they are
    regrouped Hkv/N per rank, the query heads H/N, and rank j's query heads read
    exactly its key/value heads (head h reads h // (H/Hkv)): N must divide Hkv too.

    ``window`` and ``document_ids`` are those of the whole sequence ((s,) or (B, s) ids):
    after the all-to-all each rank attends over all s positions, so the masks apply as
    in one process."""
    n = dist.get_world_size(group)
    kv_heads = k.shape[1] if enable_gqa and k.ndim == 4 else q.shape[-3]
    fits = (q.ndim == 4 and v.ndim == 4 and q.shape[1] % kv_heads == 0
            and k.shape == (q.shape[0], kv_heads) + q.shape[2:] and v.shape[:3] == k.shape[:3])
    if not fits:
        raise ValueError(f"ulysses_attention takes q of shape (B, H, s/N, D) and k, v of "
                         f"shape (B, Hkv, s/N, D), Hkv = H unless enable_gqa and Hkv "
                         f"dividing H; got {q.shape}, {k.shape}, {v.shape}")
    for name, heads in (("heads", q.shape[1]), ("key/value heads", kv_heads)):
        if heads % n:
            raise ValueError(f"Ulysses splits the {heads} {name} over the group of {n} "
                             f"ranks: the {name} must be divisible by the group size (use "
                             f"ring attention, or a group size that divides them)")
    if impl not in ("naive", "flash"):
        raise ValueError(f"impl must be 'naive' or 'flash', got {impl!r}")
    qh, kh, vh = (Regroup.apply(t, True, group) for t in (q, k, v))  # (B, H/N, s, D)
    if impl == "flash":
        out = flash_attention(qh, kh, vh, is_causal=is_causal, scale=scale,
                              enable_gqa=enable_gqa, window=window,
                              document_ids=document_ids, **blocks)
    else:
        out = naive_attention(qh, kh, vh, is_causal=is_causal, scale=scale,
                              enable_gqa=enable_gqa, window=window, document_ids=document_ids)
    return Regroup.apply(out, False, group)                         # (B, H, s/N, D)
