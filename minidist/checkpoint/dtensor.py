"""Save a state dict of DTensors sharded, and load it at another world size.

    save_dtensors(path, sharded_state_dict(model))         # fully_shard: Shard(0) pieces
    save_dtensors(path, tp_model.state_dict())             # parallelize_module: Shard(0),
                                                           # Shard(1), Replicate, arrays
    load_dtensors(path, new_model.state_dict())            # a world of another size

Each rank writes its pieces to ``path/piece-<rank>-of-<N>.npz``; rank 0 writes
``path/dtensors.json``: the world size and each tensor's global shape, layout and, for a
cut tensor, the rank whose file holds each piece (``owners``). On HSDP's 2-D mesh
(``[Replicate(), Shard(0)]``) every replica holds the same S pieces: the replica at
coordinate 0 writes them, the others write none.
A tensor cut along dim d (``Shard(d)`` on a mesh of the whole world): old rank r
held the slices [o_r, o_r + n_r) of its L along d (torch.chunk's pieces:
c = ceil(L / N), o_r = min(L, r c)); a new rank reads the old files whose slices
overlap its own and copies the overlap, so pieces move across world sizes without
gathering a whole tensor anywhere, and a Replicate (or plain array) target reads
every piece. Replicate tensors and plain arrays are saved once, by rank 0, and
read whole. A collective: every rank calls it. Loading checks ``dtensors.json``
first (``read_dtensors_manifest``): a world of 0, -3 or 10^12, a piece missing, a
negative dimension or a layout it cannot name is a ``CheckpointError``.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import minidist.distributed as dist
from minidist.backend import xp
from minidist.checkpoint.io import (CheckpointError, atomic_write_bytes, load_file,
                                    read_checkpoint_bytes, save_file)
from minidist.distributed.tensor import DTensor
from minidist.distributed.tensor.placement_types import local_shard_size_and_offset
from minidist.untrusted import MAX_JSON_BYTES, Refused, element_count

MANIFEST = "dtensors.json"


def _piece(rank: int, world: int) -> str:
    return f"piece-{rank:05d}-of-{world:05d}.npz"


def _layout(d: Any) -> str:
    """"shard<d>" for a tensor cut along dim d over one dimension of a mesh of the whole
    world (the others Replicate: HSDP's (Replicate(), Shard(0))), "replicate" for a
    Replicate DTensor or a plain array (the same on every rank)."""
    if not isinstance(d, DTensor):
        return "replicate"
    if all(p.is_replicate() for p in d.placements):
        return "replicate"
    cuts = [p for p in d.placements if p.is_shard()]
    if len(cuts) == 1 and all(p.is_shard() or p.is_replicate() for p in d.placements):
        if d.device_mesh.size() != dist.get_world_size():
            raise CheckpointError(f"save_dtensors cuts pieces by rank of the world: a DTensor "
                                  f"on a mesh of {d.device_mesh.size()} of the "
                                  f"{dist.get_world_size()} ranks needs redistributing first")
        return f"shard{cuts[0].dim}"
    raise CheckpointError(f"save_dtensors saves DTensors cut along one mesh dimension "
                          f"([Shard(d)], HSDP's [Replicate(), Shard(d)]) or Replicate, got "
                          f"{list(d.placements)}: redistribute first")


def _owners(d: Any) -> list[int]:
    """For a cut DTensor: the rank that writes piece j, for each j: the one at coordinate j
    on the cut mesh dimension and 0 on every other (one copy of each piece is saved)."""
    cut = next(i for i, p in enumerate(d.placements) if p.is_shard())
    mesh = d.device_mesh
    owners = []
    for j in range(mesh.size(cut)):
        ranks: Any = mesh.mesh
        for i in range(mesh.ndim):
            ranks = ranks[j if i == cut else 0]
        owners.append(ranks)
    return owners


def _local(d: Any) -> Any:
    return d.to_local().data if isinstance(d, DTensor) else d


def save_dtensors(path: str, state: dict[str, Any]) -> None:
    """Every rank writes its pieces of ``state`` under ``path`` (module docstring)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(path, exist_ok=True)
    layouts = {name: _layout(d) for name, d in state.items()}
    owners = {name: _owners(d) for name, d in state.items() if layouts[name] != "replicate"}
    mine = {name: _local(d) for name, d in state.items()
            if rank in owners.get(name, [0])}
    save_file(os.path.join(path, _piece(rank, world)), mine)
    if rank == 0:
        info = {"world": world,
                "tensors": {n: dict(shape=list(d.shape), layout=layouts[n],
                                    **({"owners": owners[n]} if n in owners else {}))
                            for n, d in state.items()}}
        atomic_write_bytes(os.path.join(path, MANIFEST), json.dumps(info).encode())
    dist.barrier()


def load_dtensors(path: str, state: dict[str, Any]) -> None:
    """Fill every DTensor (or array, in place) of ``state`` (this world's pieces) from the
    checkpoint at ``path``, written by a world of any size."""
    tensors, old_world = read_dtensors_manifest(path)
    files: dict[int, dict] = {}

    def old(r: int) -> dict:
        if r not in files:
            files[r] = load_file(os.path.join(path, _piece(r, old_world)))
        return files[r]

    for name, d in state.items():
        saved = tensors.get(name)
        if saved is None or tuple(saved["shape"]) != tuple(d.shape):
            raise CheckpointError(f"{path}: no tensor {name!r} of shape {tuple(d.shape)} "
                                  f"(saved: {saved})")
        local, mine = _local(d), _layout(d)
        if saved["layout"] == "replicate":
            if mine == "replicate":
                local[...] = xp.asarray(old(0)[name])
                continue
            dim, owners = int(mine[len("shard"):]), [0]   # my slice of rank 0's whole tensor
            pieces = 1
        else:
            dim, owners = int(saved["layout"][len("shard"):]), saved["owners"]
            pieces = len(owners)
            if mine not in ("replicate", saved["layout"]):
                raise CheckpointError(f"{path}: {name!r} was saved cut along dim {dim}, the "
                                      f"tensor to fill is cut otherwise ({mine}): "
                                      f"redistribute it first")
        along = xp.moveaxis(local, dim, 0)                 # a view: dim d first
        start = d._spec.local_offset()[dim] if mine != "replicate" else 0
        stop = start + along.shape[0]
        for r in range(pieces):
            size, offset = local_shard_size_and_offset(d.shape[dim], pieces, r)
            lo, hi = max(start, offset), min(stop, offset + size)
            if lo < hi:                                   # old piece r overlaps mine
                piece = xp.moveaxis(xp.asarray(old(owners[r])[name]), dim, 0)
                along[lo - start:hi - start] = piece[lo - offset:hi - offset]


def read_dtensors_manifest(path: str) -> tuple[dict[str, dict], int]:
    """(tensors, world) from ``path/dtensors.json``, checked before anything is read or
    allocated: world an int from 1 to the number of pieces present, every piece of that
    world present, each tensor's shape non-negative ints and its layout "replicate" or
    "shard<d>" with d one of its dims."""
    mpath = os.path.join(path, MANIFEST)
    data = read_checkpoint_bytes(mpath, MAX_JSON_BYTES, "DTensor manifest")
    try:
        info = json.loads(data)
        world, tensors = info["world"], info["tensors"]
    except (ValueError, RecursionError, TypeError, KeyError) as e:
        raise CheckpointError(f"{mpath} is not a DTensor manifest ({type(e).__name__}: "
                              f"{e})") from None
    present = {n for n in os.listdir(path) if re.fullmatch(r"piece-\d{5}-of-\d{5}\.npz", n)}
    if not isinstance(world, int) or isinstance(world, bool) or not 1 <= world <= len(present):
        raise CheckpointError(f"{mpath} says world {world!r}; the directory holds "
                              f"{len(present)} piece files: refused")
    missing = [_piece(r, world) for r in range(world) if _piece(r, world) not in present]
    if missing:
        raise CheckpointError(f"{mpath} says world {world}, but {missing[0]} is missing")
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{mpath}: \"tensors\" is not a dict of name -> entry")
    for name, saved in tensors.items():
        try:
            element_count(saved["shape"], sys.maxsize, f"{mpath}: tensor {name!r}")
            layout = saved["layout"]
            dims = len(saved["shape"])
        except (TypeError, KeyError):
            raise CheckpointError(f"{mpath}: tensor {name!r} has entry {saved!r}, not "
                                  f"{{shape, layout}}") from None
        except Refused as e:
            raise CheckpointError(str(e)) from None
        cut = re.fullmatch(r"shard(\d+)", layout) if isinstance(layout, str) else None
        if layout != "replicate" and (cut is None or int(cut.group(1)) >= dims):
            raise CheckpointError(f"{mpath}: tensor {name!r} has layout {layout!r}, not "
                                  f"\"replicate\" or \"shard<d>\" with d < {dims}")
        if layout != "replicate":
            saved["owners"] = _checked_owners(saved.get("owners", list(range(world))), world,
                                              f"{mpath}: tensor {name!r}")
    return tensors, world


def _checked_owners(owners: Any, world: int, what: str) -> list[int]:
    """The ranks whose files hold pieces 0, 1, ... of a cut tensor: distinct ints of
    [0, world) (a manifest written before HSDP has none: one piece per rank)."""
    if (not isinstance(owners, list) or not 1 <= len(owners) <= world
            or any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world
                   for r in owners) or len(set(owners)) != len(owners)):
        raise CheckpointError(f"{what} has owners {owners!r}: not 1 to {world} distinct "
                              f"ranks of the world {world}")
    return owners
