"""visualize_sharding for a composed model: which ranks hold which block of one weight.

torch's ``visualize_sharding`` (here distributed/tensor/debug/visualize.py) reads a
DTensor's placements. A model made by ``parallelize_llama`` holds plain pieces, cut by
tensor parallelism (a slice), then FSDP (a Shard(0) piece of that slice), on the ranks of
the pipeline stage that holds the layer. Which dense positions a rank holds is found as
compare finds them: the dense model's flat indices go through the model's own slicing
(``ParallelLlama.shard_of``). Every rank calls it (one all-gather over the world of a
mask the weight's size per rank: a debugging aid for small models); rank 0 prints::

    visualize_sharding(model, "layers.0.self_attn.q_proj.weight")
    layers.0.self_attn.q_proj.weight (16, 16)
    block                   ranks
    [0:4, 0:16]             0
    [4:8, 0:16]             2
    [8:12, 0:16]            1
    [12:16, 0:16]           3
    not held by             4, 5, 6, 7   (other pipeline stages)

A block is written as row (and column) ranges; a piece that is not one rectangle (a
tensor-parallel rank's heads inside a fused q, k, v matrix) lists each range: [0:4+8:12, 0:16].
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp


def _runs(held: Any) -> str:
    """The indices where a 1-D boolean host array is True, as ranges: "0:4+8:12"."""
    runs, start = [], None
    for i, h in enumerate(list(held) + [False]):
        if h and start is None:
            start = i
        elif not h and start is not None:
            runs.append(f"{start}:{i}")
            start = None
    return "+".join(runs)


def block_text(mask: Any) -> str:
    """A rank's piece of a 1-D or 2-D weight (a boolean host array of its shape) as text."""
    if mask.ndim == 1:
        return f"[{_runs(mask)}]"
    rows, cols = mask.any(axis=1), mask.any(axis=0)
    if (mask == (rows[:, None] & cols[None, :])).all():
        return f"[{_runs(rows)}, {_runs(cols)}]"
    return f"({int(mask.sum())} scattered elements)"


def sharding_table(masks: list) -> tuple[list[tuple[str, list[int]]], list[int]]:
    """([(block, ranks holding it)] in order of first rank, [ranks holding none of it])."""
    table: dict[str, list[int]] = {}
    empty = []
    for rank, mask in enumerate(masks):
        if not mask.any():
            empty.append(rank)
            continue
        table.setdefault(block_text(mask), []).append(rank)
    return list(table.items()), empty


def _dense_shapes(model: Any) -> dict:
    from minidist.nn import GPT
    from minidist.nn.llama import Llama, LlamaConfig
    dense = Llama(model.cfg) if isinstance(model.cfg, LlamaConfig) else GPT(model.cfg)
    return {n: q.data.shape for n, q in dense.named_parameters()}


def sharding_text(model: Any, name: str) -> str:
    """Every rank: the table of ``name``'s blocks and the ranks holding them, as text."""
    shapes = _dense_shapes(model)
    if name not in shapes:
        raise KeyError(f"no parameter {name!r}; the model's are e.g. {', '.join(list(shapes)[:4])}")
    flat = {n: xp.arange(int(xp.prod(xp.array(s))), dtype="int64").reshape(s)
            for n, s in shapes.items()}
    mine = model.shard_of(flat).get(name)
    size = flat[name].size
    mask = xp.zeros(size, dtype="int32")                    # 1 where this rank holds it
    if mine is not None:
        mask[mine.reshape(-1)] = 1
    everyone = xp.zeros(dist.get_world_size() * size, dtype="int32")
    dist.all_gather_into_tensor(everyone, mask)
    host = backend.to_host(everyone).reshape(-1, *shapes[name]).astype(bool)  # (world, *shape)
    table, empty = sharding_table(list(host))
    width = max([24] + [len(block) + 2 for block, _ in table])
    lines = [f"{name} {tuple(shapes[name])}", f"{'block':<{width}}ranks"]
    lines += [f"{block:<{width}}{', '.join(str(r) for r in ranks)}" for block, ranks in table]
    if empty:
        lines.append(f"{'not held by':<{width}}{', '.join(str(r) for r in empty)}")
    return "\n".join(lines)


def visualize_sharding(model: Any, name: str, all_ranks: bool = False) -> str:
    """Print (on rank 0, or on every rank) and return ``sharding_text``; every rank calls it."""
    text = sharding_text(model, name)
    if all_ranks or dist.get_rank() == 0:
        print(text)
    return text
