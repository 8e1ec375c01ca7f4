"""A Llama trained context-parallel: each rank holds a part of every sequence.

    rank r holds tokens S_r of each row (zigzag for ring attention, contiguous for
    Ulysses), and their global positions p = S_r, so RoPE turns q and k as in the
    whole sequence:  rope(x_t, p_t) depends on the token's place in the sequence, not in
    the shard. Attention is the only step that mixes positions, so only it
    communicates (ring: K/V blocks round the ring; Ulysses: all-to-all to heads).
    loss_r = mean CE over S_r;  the gradient of the mean over all tokens is the average
    over ranks of grad loss_r (equal shards), so the gradients are all-reduced and
    divided by N, exactly as data parallelism does over batches.

Grouped-query attention passes through: ring attention sends only the nkv key/value
heads round the ring; Ulysses regroups nkv/N of them per rank (N must divide nkv).
Sliding windows and packed documents work under both: pass ``document_ids`` of the
whole sequence (the same on every rank) and each rank's ``position_ids``, its shard of
the positions that restart per document (``nn.llama.positions_in_documents``), so
RoPE turns each token by its place in its own document. Ulysses attends over the whole
sequence after the all-to-all; the ring masks each block by the global positions of
its queries and keys, and skips the blocks outside the window or the documents.

    context_parallel(model, group, "ring")          # every attention through the ring
    pos = sequence_positions(T, rank, N, "zigzag")  # this rank's global positions
    _, loss = model(shard(idx), shard(targets), position_ids=pos); loss.backward()
    average_gradients(model, group)
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.backend import xp
from minidist.distributed._shared_tokens import share_tokens
from minidist.nn.llama import LlamaDecoderLayer
from minidist.nn.module import Module
from minidist.parallel.context.ring_attention import ring_attention, shard_sequence
from minidist.parallel.context.ulysses import split_sequence, ulysses_attention

KINDS = ("ring", "ulysses")


def context_parallel(model: Module, group: Any = None, kind: str = "ring",
                     layout: str = "zigzag", impl: str = "naive") -> Module:
    """Route every ``GroupedQueryAttention`` of ``model`` (in its ``blocks``) through ring
    attention (``layout`` zigzag or contiguous) or Ulysses (``impl``: naive or flash)
    over ``group``; returns the model. Ulysses needs ``group`` to divide the heads and
    the key/value heads, and says so when it does not."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    refuse_without_positions(model)
    n = dist.get_world_size(group)
    cfg = model.config
    if kind == "ulysses":
        for name in ("num_attention_heads", "num_key_value_heads"):
            if getattr(cfg, name) % n:
                raise ValueError(f"Ulysses splits heads over the context-parallel group: "
                                 f"{name}={getattr(cfg, name)} is not divisible by {n} (use "
                                 f"ring attention, or a group that divides it)")

    def ring(q, k, v, is_causal=False, enable_gqa=False, window=None, document_ids=None):
        return ring_attention(q, k, v, is_causal=is_causal, group=group, layout=layout,
                              enable_gqa=enable_gqa, window=window, document_ids=document_ids)

    def ulysses(q, k, v, is_causal=False, enable_gqa=False, window=None, document_ids=None):
        return ulysses_attention(q, k, v, is_causal=is_causal, group=group, impl=impl,
                                 enable_gqa=enable_gqa, window=window,
                                 document_ids=document_ids)

    for block in model.blocks:
        block.self_attn.attention = ring if kind == "ring" else ulysses
    share_tokens(model, group, "sequence")   # the routers count the whole sequences
    return model


def refuse_without_positions(model: Module) -> None:
    """A rank's shard of a sequence needs its tokens' global positions: a Llama's layers
    take them (``position_ids``, which RoPE turns q and k by); a model whose blocks are no
    Llama decoder layers (the GPT: a learned table of positions 0 .. T-1, no
    ``position_ids``) would embed every shard at the start of the sequence."""
    for block in model.blocks:
        if not isinstance(block, LlamaDecoderLayer):
            raise TypeError(
                f"context_parallel takes a Llama: each rank's shard of a sequence needs its "
                f"tokens' global positions (position_ids), and {type(model).__name__}'s "
                f"{type(block).__name__} blocks take none (a learned position table read "
                "from 0). Train it with data, tensor or pipeline parallelism, or use "
                "minidist.nn.Llama")


def sequence_positions(length: int, rank: int, world_size: int, kind: str = "ring",
                       layout: str = "zigzag") -> Any:
    """The global positions of the tokens ``rank`` holds: (length / N,) integers."""
    positions = xp.arange(length)
    return shard_tokens(positions, rank, world_size, kind, layout)


def shard_tokens(x: Any, rank: int, world_size: int, kind: str = "ring",
                 layout: str = "zigzag") -> Any:
    """This rank's tokens of ``x`` (..., T) along its last axis, as ``kind`` splits them."""
    if kind == "ulysses":
        return split_sequence(x, rank, world_size, axis=-1)
    return shard_sequence(x, rank, world_size, layout, axis=-1)


def average_gradients(model: Module, group: Any = None) -> None:
    """grad <- (sum over the group of grad) / N: the gradient of the mean over all tokens."""
    n = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= n
