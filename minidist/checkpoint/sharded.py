"""Sharded checkpoints for ZeRO: each rank writes its shard; loading reshards.

Layout of a checkpoint directory:

    path/LATEST                       the name of the complete version: "v3"
    path/v3/manifest.json             world size, stage, flat groups (numel, dtype,
                                      parameter names and shapes), optimizer
                                      hyperparameters, sampler state, and per file its
                                      size and sha256 (JSON; values as in tree.py)
    path/v3/shard-00001-of-00004.npz  rank 1's shard of every flat group: master
                                      weights, optimizer buffers (exp_avg, ...), step
                                      counts, and rank 1's RNG state (records.py);
                                      shard 0 also the model's persistent buffers
                                      (whole on every rank: saved once, loaded by all)

Saving writes a new version next to the old one and only then replaces LATEST
(atomically, io.py), so a crash at any point leaves LATEST naming a complete
checkpoint. Older versions are removed after. What a killed save left (a
version newer than LATEST, half written; a temporary of LATEST) is removed by
the next save, or by the next load (rank 0, before it reads); a complete
version never is, until a newer one is published. Without a LATEST that
parses, a load removes nothing and says which versions exist. Every name read
from LATEST or the manifest must be of the form save writes (``v3``,
``shard-00001-of-00004.npz``) and resolve inside the checkpoint
(minidist/untrusted.py).

Resharding: each flat group is a logical vector of P elements, which the old
world cut into shards of S_old = ceil(P/N_old) and the new one cuts into
S_new = ceil(P/N_new). New rank r needs elements [r*S_new, (r+1)*S_new) and reads
only the old shard files that overlap that range. Buffers of the same length as
the shard (the Adam moments, momentum) are resharded the same way; scalars (step)
are copied. A rank of the new world that existed in the old one gets its RNG
state back; a new rank keeps its own.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp
from minidist.checkpoint.io import (CONVERT, CheckpointError, atomic_write_bytes, load_file,
                                   read_checkpoint_bytes, refuse_pickle,
                                   remove_stale_temporaries, save_file)
from minidist.checkpoint.tree import FormatError, flatten, key_path, unflatten
from minidist.nn.module import persistent_buffers
from minidist.untrusted import MAX_JSON_BYTES, Refused, confined_name

FORMAT = "minidist-sharded-2"     # 1: shard files were pickles
VERSION = r"v\d+"                 # the names of version directories, and LATEST's value
SHARD = r"shard-\d{5}-of-\d{5}\.npz"  # a shard file's name (shard_name)


def shard_name(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.npz"


def _group_info(zero: Any) -> list[dict]:
    names = {id(p): n for n, p in zero.module.named_parameters()}
    return [dict(numel=lay.numel, dtype=lay.dtype.name,
                 params=[[names.get(id(p), "?"), list(s)] for p, s in zip(lay.params,
                                                                         lay.shapes)])
            for lay in zero.layouts]


def save_sharded(path: str, zero: Any, sampler: Any = None, extra: dict | None = None) -> str:
    """Every rank writes its shard of ``zero`` (Zero1/2/3) under ``path``; returns the
    version directory. A collective: every rank of ``zero.group`` must call it."""
    group, rank, world = zero.group, zero.rank, zero.world_size
    # the manifest's values, checked on every rank before any file is written, so a
    # value a manifest cannot hold is an error on every rank, not a hang in barrier()
    hyper = {k: v for k, v in zero.optimizer.param_groups[0].items() if k != "params"}
    values = dict(hyperparameters=manifest_value(hyper, "the hyperparameters"),
                  sampler=manifest_value(sampler.state_dict() if sampler is not None else None,
                                         "the sampler's state"),
                  extra=manifest_value(extra or {}, "extra"))
    version = backend.from_host([_next_version(path) if rank == 0 else 0])
    dist.broadcast(version, src=0 if group is None else group.global_rank(0), group=group)
    vdir = os.path.join(path, f"v{int(backend.to_host(version)[0])}")
    shards = []
    for shard in zero.shards:
        state = zero.optimizer.state.get(shard, {})
        shards.append(dict(param=shard.data, state=dict(state)))
    name = shard_name(rank, world)
    digest = save_file(os.path.join(vdir, name), dict(
        rank=rank, world_size=world, groups=shards,
        rng=backend.default_generator().get_state(),
        buffers=dict(persistent_buffers(zero.module)) if rank == 0 else {}))
    size = os.path.getsize(os.path.join(vdir, name))
    # every rank's digest and size to every rank: 32 + 8 bytes each
    mine = backend.from_host(list(bytes.fromhex(digest)) + list(size.to_bytes(8, "little")),
                             dtype="uint8")                                        # (40,)
    everyone = xp.zeros(40 * world, dtype="uint8")
    dist.all_gather_into_tensor(everyone, mine, group=group)
    if rank == 0:
        table = bytes(int(b) for b in backend.to_host(everyone))
        files = [dict(name=shard_name(r, world), sha256=table[40 * r:40 * r + 32].hex(),
                      bytes=int.from_bytes(table[40 * r + 32:40 * r + 40], "little"))
                 for r in range(world)]
        manifest = dict(format=FORMAT, world_size=world, stage=zero.stage,
                        precision=zero.precision, groups=_group_info(zero), files=files,
                        optimizer=type(zero.optimizer).__name__, **values)
        atomic_write_bytes(os.path.join(vdir, "manifest.json"),
                           json.dumps(manifest, indent=1, allow_nan=False).encode())
        _publish(path, os.path.basename(vdir))
    dist.barrier(group=group)
    return vdir


def manifest_value(value: Any, what: str) -> Any:
    """``value`` as the manifest's JSON (tree.py's tags): plain values only, no arrays."""
    try:
        structure, arrays = flatten(value)
    except FormatError as e:
        raise CheckpointError(f"cannot save {what} in a sharded checkpoint: {e}") from None
    if arrays:
        where = ", ".join(key_path(p) for p, _ in arrays)
        raise CheckpointError(f"cannot save {what} in a sharded checkpoint: it holds arrays "
                              f"(at {where}); the manifest holds plain values only")
    return structure


def _next_version(path: str) -> int:
    return max(_versions(path), default=0) + 1 if os.path.isdir(path) else 1


def _publish(path: str, version: str) -> None:
    """Point LATEST at the new version (atomic), then remove the older ones."""
    atomic_write_bytes(os.path.join(path, "LATEST"), version.encode())
    for n in _versions(path):
        if f"v{n}" != version:
            shutil.rmtree(os.path.join(path, f"v{n}"), ignore_errors=True)


def _versions(path: str) -> list[int]:
    """The numbers of the version directories under ``path`` (v1 -> 1), ascending."""
    return sorted(int(d[1:]) for d in os.listdir(path) if re.fullmatch(VERSION, d))


def remove_partial_versions(path: str) -> list[str]:
    """Remove the version directories newer than the one LATEST names: saves that were
    killed before publishing. Without a LATEST that parses, nothing can be proven
    unfinished, so nothing is removed (read_manifest then says what exists)."""
    if not os.path.isdir(path):
        return []
    remove_stale_temporaries(os.path.join(path, "LATEST"))
    try:
        newest_complete = int(_read_latest(path)[1:])
    except CheckpointError:
        return []          # no LATEST, or not ours to interpret: touch nothing
    removed = []
    for n in _versions(path):
        if n > newest_complete:
            shutil.rmtree(os.path.join(path, f"v{n}"), ignore_errors=True)
            removed.append(f"v{n}")
    return removed


def _read_latest(path: str) -> str:
    """The version LATEST names ("v3"), once it is one: a plain ``v<digits>``."""
    latest = os.path.join(path, "LATEST")
    if not os.path.lexists(latest):
        found = ", ".join(f"v{n}" for n in _versions(path)) if os.path.isdir(path) else ""
        how = (f"; it holds {found}: if the newest complete one is vN, publish it with "
               f"`echo vN > {latest}`" if found else "")
        raise CheckpointError(f"no checkpoint at {path}: {latest} is missing{how}")
    data = read_checkpoint_bytes(latest, 64, "LATEST")
    name = data.decode("ascii", errors="backslashreplace").strip()
    if not re.fullmatch(VERSION, name):
        raise CheckpointError(f"{latest} names {name!r}, not a version (v1, v2, ...): "
                              f"refused (nothing outside {path} is read)")
    return name


def read_manifest(path: str) -> tuple[str, dict]:
    """The version directory LATEST names, and its manifest (values decoded)."""
    try:
        vdir = confined_name(path, _read_latest(path), VERSION, os.path.join(path, "LATEST"))
    except Refused as e:
        raise CheckpointError(str(e)) from None
    mpath = os.path.join(vdir, "manifest.json")
    data = read_checkpoint_bytes(mpath, MAX_JSON_BYTES, "checkpoint manifest")
    refuse_pickle(data, mpath)
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as e:   # not UTF-8, or not JSON
        raise CheckpointError(f"checkpoint manifest {mpath} is corrupt: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        if got == "minidist-sharded-1":
            raise CheckpointError(f"{mpath} is an old-format checkpoint whose shard files are "
                                  "pickles, which minidist never loads; if you trust it, "
                                  f"convert it once: `{CONVERT}` (OLD, NEW: directories)")
        raise CheckpointError(f"{mpath} says format {got!r}, expected {FORMAT!r}")
    try:
        for key in ("hyperparameters", "sampler", "extra"):
            manifest[key] = unflatten(manifest.get(key), [])
    except (FormatError, RecursionError) as e:
        raise CheckpointError(f"checkpoint manifest {mpath} is corrupt: {e}") from None
    return vdir, manifest


def load_sharded(path: str, zero: Any, sampler: Any = None) -> dict:
    """Restore ``zero`` from the latest checkpoint under ``path``, saved at any world
    size with the same model and grouping; returns the saved ``extra``.

    A collective. Each rank first reads and checks what it needs; the ranks then
    agree (one all-reduce of a flag) before anything changes, so a file that one
    rank cannot read is an error on every rank, never a hang or a half-loaded model.
    """
    error = None
    if zero.rank == 0:
        remove_partial_versions(path)
    try:
        vdir, manifest, pieces, rng, buffers = _read_my_part(path, zero)
    except CheckpointError as e:
        error = e
    except (KeyError, IndexError, TypeError, ValueError) as e:   # well-formed, wrong shape
        error = CheckpointError(f"the checkpoint under {path} is not laid out as save_sharded "
                                f"writes it ({type(e).__name__}: {e})")
    flag = backend.from_host([0 if error is None else 1], dtype="int64")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=zero.group)
    if error is not None:
        raise error
    if int(backend.to_host(flag)[0]):
        raise CheckpointError(f"another rank could not read its part of the checkpoint "
                              f"under {path} (its error names the file)")
    for name, b in persistent_buffers(zero.module).items():
        b[...] = xp.asarray(buffers[name])
    for shard, new in zip(zero.shards, pieces):
        shard.data[...] = new["param"]
        state = {k: v for k, v in new.items() if k != "param"}
        if state:
            zero.optimizer.state[shard] = state
        else:
            zero.optimizer.state.pop(shard, None)
    group0 = zero.optimizer.param_groups[0]
    for k, v in manifest["hyperparameters"].items():
        group0[k] = tuple(v) if isinstance(group0.get(k), tuple) else v
    if rng is not None:
        backend.default_generator().set_state(rng)
    if sampler is not None and manifest.get("sampler") is not None:
        sampler.load_state_dict(manifest["sampler"])
    zero.after_load()
    return manifest["extra"]


def _read_my_part(path: str, zero: Any) -> tuple[str, dict, list[dict], Any, dict]:
    """Check the manifest against ``zero``; read this rank's new shard of every group."""
    vdir, manifest = read_manifest(path)
    mpath = os.path.join(vdir, "manifest.json")
    mine = _group_info(zero)
    if len(manifest["groups"]) != len(mine):
        raise CheckpointError(f"{mpath}: {len(manifest['groups'])} flat groups saved, this "
                              f"ZeRO-{zero.stage} wrapper has {len(mine)} (another stage, "
                              "bucket size or model?)")
    for g, (saved, now) in enumerate(zip(manifest["groups"], mine)):
        if saved != now:
            raise CheckpointError(f"{mpath}: flat group {g} was saved as {saved['params']} "
                                  f"({saved['numel']} x {saved['dtype']}), this model has "
                                  f"{now['params']} ({now['numel']} x {now['dtype']})")
    old_world = manifest["world_size"]
    if not isinstance(old_world, int) or old_world < 1 or \
            len(manifest["files"]) != old_world:
        raise CheckpointError(f"{mpath} lists {len(manifest['files'])} shard files for a "
                              f"world of {old_world!r}")
    cache: dict[int, dict] = {}

    def old_shard(r: int) -> dict:
        if r not in cache:
            info = manifest["files"][r]
            cache[r] = load_file(_shard_path(vdir, info["name"], r, old_world, mpath),
                                 info["sha256"], info["bytes"])
        return cache[r]

    pieces = [_gather_range(layout, old_world, lambda r, g=g: old_shard(r)["groups"][g])
              for g, layout in enumerate(zero.layouts)]
    rng = old_shard(zero.rank)["rng"] if zero.rank < old_world else None
    return vdir, manifest, pieces, rng, _saved_buffers(zero, old_shard(0), mpath)


def _saved_buffers(zero: Any, first: dict, mpath: str) -> dict:
    """The model's persistent buffers as rank 0 saved them (every rank holds the same),
    each name and shape checked against the model's."""
    saved, own = first.get("buffers", {}), persistent_buffers(zero.module)
    if set(saved) != set(own):
        raise CheckpointError(f"{mpath}: the checkpoint holds the buffers {sorted(saved)}, "
                              f"this model has {sorted(own)}")
    for name, b in own.items():
        if tuple(saved[name].shape) != tuple(b.shape):
            raise CheckpointError(f"{mpath}: buffer {name!r} saved of shape "
                                  f"{tuple(saved[name].shape)}, {tuple(b.shape)} in the model")
    return saved


def _shard_path(vdir: str, name: Any, rank: int, world: int, mpath: str) -> str:
    """Where old ``rank``'s shard is: the manifest must name exactly the file
    save_sharded writes for it, inside the version directory."""
    if name != shard_name(rank, world):
        raise CheckpointError(f"{mpath} names {name!r} as rank {rank}'s shard, not "
                              f"{shard_name(rank, world)!r}: refused (nothing outside "
                              f"{vdir} is read)")
    try:
        return confined_name(vdir, name, SHARD, mpath)
    except Refused as e:
        raise CheckpointError(str(e)) from None


def _gather_range(layout: Any, old_world: int, saved_group: Any) -> dict:
    """This rank's new shard of every array of a flat group, from the old shards."""
    numel, s_old = layout.numel, -(-layout.numel // old_world)
    lo, hi = layout.lo, min(layout.hi, numel)          # the real elements I now own
    out: dict[str, Any] = {}
    first = saved_group(lo // s_old if lo < numel else 0)
    keys = ["param"] + [k for k in first["state"]]
    for k in keys:
        value = first["param"] if k == "param" else first["state"][k]
        if not backend.is_array(value):
            out[k] = value                             # a scalar, e.g. Adam's step
            continue
        out[k] = xp.zeros(layout.shard_size, dtype=value.dtype)   # (S_new,), padding zero
    if lo >= hi:
        return out
    for r in range(lo // s_old, (hi - 1) // s_old + 1):
        saved = saved_group(r)
        a, b = max(lo, r * s_old), min(hi, (r + 1) * s_old)     # overlap, global indices
        for k in keys:
            value = saved["param"] if k == "param" else saved["state"][k]
            if backend.is_array(value):
                out[k][a - lo:b - lo] = value[a - r * s_old:b - r * s_old]
    return out
