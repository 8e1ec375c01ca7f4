"""Save a state dict of Shard(0) DTensors sharded, and load it at another world size.

    save_dtensors(path, sharded_state_dict(model))         # every rank its pieces
    load_dtensors(path, sharded_state_dict(new_model))     # a world of another size

Each rank writes its dim-0 pieces to ``path/piece-<rank>-of-<N>.npz``; rank 0
writes ``path/dtensors.json``: the world size and each tensor's global shape.
Old rank r held rows [o_r, o_r + n_r) of a tensor of L rows (torch.chunk's
pieces: c = ceil(L / N), o_r = min(L, r c)); a new rank reads the old files whose
rows overlap its own and copies the overlap, so pieces move across world sizes
without gathering a whole tensor anywhere. Replicate tensors are saved once, by
rank 0, and read whole. A collective: every rank calls it.
"""
from __future__ import annotations

import json
import os

import minidist.distributed as dist
from minidist.backend import xp
from minidist.checkpoint.io import CheckpointError, atomic_write_bytes, load_file, save_file
from minidist.distributed.tensor import DTensor, Shard
from minidist.distributed.tensor.placement_types import local_shard_size_and_offset

MANIFEST = "dtensors.json"


def _piece(rank: int, world: int) -> str:
    return f"piece-{rank:05d}-of-{world:05d}.npz"


def _layout(d: DTensor) -> str:
    if d.placements == (Shard(0),):
        return "shard0"
    if all(p.is_replicate() for p in d.placements):
        return "replicate"
    raise CheckpointError(f"save_dtensors saves [Shard(0)] or Replicate DTensors, got "
                          f"{list(d.placements)}: redistribute first")


def save_dtensors(path: str, state: dict[str, DTensor]) -> None:
    """Every rank writes its pieces of ``state`` under ``path`` (module docstring)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(path, exist_ok=True)
    mine = {}
    for name, d in state.items():
        if _layout(d) == "shard0" or rank == 0:
            mine[name] = d.to_local().data
    save_file(os.path.join(path, _piece(rank, world)), mine)
    if rank == 0:
        info = {"world": world, "tensors": {n: {"shape": list(d.shape), "layout": _layout(d)}
                                            for n, d in state.items()}}
        atomic_write_bytes(os.path.join(path, MANIFEST), json.dumps(info).encode())
    dist.barrier()


def load_dtensors(path: str, state: dict[str, DTensor]) -> None:
    """Fill every DTensor of ``state`` (this world's pieces) from the checkpoint at
    ``path``, written by a world of any size."""
    with open(os.path.join(path, MANIFEST)) as f:
        info = json.load(f)
    old_world = info["world"]
    files: dict[int, dict] = {}

    def old(r: int) -> dict:
        if r not in files:
            files[r] = load_file(os.path.join(path, _piece(r, old_world)))
        return files[r]

    for name, d in state.items():
        saved = info["tensors"].get(name)
        if saved is None or tuple(saved["shape"]) != tuple(d.shape):
            raise CheckpointError(f"{path}: no tensor {name!r} of shape {d.shape} "
                                  f"(saved: {saved})")
        local = d.to_local().data
        if saved["layout"] == "replicate":
            local[...] = old(0)[name]
            continue
        rows = d.shape[0]
        start = d._spec.local_offset()[0] if _layout(d) == "shard0" else 0
        stop = start + local.shape[0]
        for r in range(old_world):
            size, offset = local_shard_size_and_offset(rows, old_world, r)
            lo, hi = max(start, offset), min(stop, offset + size)
            if lo < hi:                                   # old piece r overlaps mine
                local[lo - start:hi - start] = xp.asarray(old(r)[name])[lo - offset:hi - offset]
