"""Convert an old (pickled) checkpoint into the data-only format, once, on request.

    minidist checkpoint convert OLD NEW --trust-pickle

Checkpoints were once pickles, and unpickling runs whatever code the file names:
a file whose object has a ``__reduce__`` returning ``(os.system, ("...",))``
runs that command on load. So loading never unpickles (io.py), and this is the
only place that does, only when told the file is trusted (``trust_pickle``).
Even then the unpickler resolves only the names an old checkpoint uses (NumPy's
array and scalar rebuilders, ml_dtypes' dtypes, the old array wrapper) and
refuses any other, so a crafted file fails here too instead of running. The
converted file is read back and compared with what was unpickled, bit for bit.

OLD may be one file (``save_checkpoint`` / ``save_file``) or a sharded
checkpoint directory (``save_sharded``): NEW is then a directory holding its
latest version, as v1.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import sys
from typing import Any, Callable

from minidist import backend
from minidist.checkpoint.io import (CheckpointError, atomic_write_bytes, load_file,
                                    save_file)
from minidist.checkpoint.sharded import FORMAT, manifest_value, read_manifest, shard_name

_NUMPY = {"dtype", "ndarray", "_reconstruct", "scalar", "_frombuffer"}
_NUMPY_MODULES = {"numpy", "numpy.core.multiarray", "numpy._core.multiarray",
                  "numpy.core.numeric", "numpy._core.numeric"}


class _OldHostArray:
    """Stands in for the old format's array wrapper: its state is ``{"host": array}``."""


class _OldCheckpointUnpickler(pickle.Unpickler):
    """Resolves only the names an old minidist checkpoint holds."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "minidist.checkpoint.io" and name == "_HostArray":
            return _OldHostArray
        if module in _NUMPY_MODULES and name in _NUMPY:
            return super().find_class(module, name)
        if module == "collections" and name == "OrderedDict":
            return super().find_class(module, name)
        if module == "ml_dtypes" and name.isidentifier():
            found = super().find_class(module, name)
            if isinstance(found, type):               # a dtype's scalar type: bfloat16, ...
                return found
        raise pickle.UnpicklingError(f"the pickle asks for {module}.{name}, which no "
                                     "minidist checkpoint holds: refused, not converted")


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, _OldHostArray):
        return obj.__dict__["host"]
    if isinstance(obj, dict):
        return {k: _unwrap(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(v) for v in obj)
    return obj


def read_old_file(path: str) -> Any:
    """Unpickle an old-format checkpoint file (restricted names); host arrays."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    if data[:4] == b"PK\x03\x04":
        raise CheckpointError(f"{path} is a zip archive, not a pickle: already in the "
                              "data-only format? (load it with load_file)")
    try:
        return _unwrap(_OldCheckpointUnpickler(io.BytesIO(data)).load())
    except Exception as e:  # a bad pickle raises many kinds of error
        raise CheckpointError(f"{path} is not an old-format minidist checkpoint "
                              f"({type(e).__name__}: {e})") from None


def _same(a: Any, b: Any) -> bool:
    """Equal bit for bit, with the same types (arrays: dtype, shape and bytes)."""
    if backend.is_array(a) or hasattr(a, "dtype"):
        a, b = backend.to_host(a), backend.to_host(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex() if a == a else b != b
    return type(a) is type(b) and a == b


def _convert_file(old: str, new: str) -> str:
    tree = read_old_file(old)
    digest = save_file(new, tree)
    if not _same(tree, load_file(new, digest)):
        os.remove(new)
        raise CheckpointError(f"{new} did not read back equal to {old}; removed")
    return digest


def convert(old: str, new: str, trust_pickle: bool = False) -> list[str]:
    """Write ``new`` in the data-only format from the old pickle ``old`` (a file or a
    sharded checkpoint directory); returns the files written."""
    if not trust_pickle:
        raise CheckpointError(f"{old} would be unpickled, and unpickling can run any code "
                              "the file names: convert only a checkpoint you trust, and say "
                              "so with --trust-pickle (trust_pickle=True)")
    if os.path.exists(new):
        raise CheckpointError(f"{new} exists: give a new path for the converted checkpoint "
                              "(nothing is overwritten)")
    if not os.path.isdir(old):
        _convert_file(old, new)
        return [new]
    vdir, manifest = _read_old_manifest(old)
    out = os.path.join(new, "v1")
    files = []
    for entry in manifest["files"]:
        rank, world = len(files), manifest["world_size"]
        target = os.path.join(out, shard_name(rank, world))
        digest = _convert_file(os.path.join(vdir, entry["name"]), target)
        files.append(dict(name=shard_name(rank, world), sha256=digest,
                          bytes=os.path.getsize(target)))
    manifest.update(format=FORMAT, files=files,
                    **{k: manifest_value(manifest.get(k), k)
                       for k in ("hyperparameters", "sampler", "extra")})
    atomic_write_bytes(os.path.join(out, "manifest.json"),
                       json.dumps(manifest, indent=1, allow_nan=False).encode())
    atomic_write_bytes(os.path.join(new, "LATEST"), b"v1")
    read_manifest(new)                                   # the new one reads
    return [os.path.join(out, f["name"]) for f in files] + [os.path.join(out, "manifest.json")]


def _read_old_manifest(path: str) -> tuple[str, dict]:
    """The version LATEST names and its manifest, which must be of the old format."""
    try:
        with open(os.path.join(path, "LATEST")) as f:
            vdir = os.path.join(path, f.read().strip())
        with open(os.path.join(vdir, "manifest.json"), "rb") as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not a sharded checkpoint ({e})") from None
    got = manifest.get("format") if isinstance(manifest, dict) else None
    if got != "minidist-sharded-1":
        raise CheckpointError(f"{path} is not an old-format sharded checkpoint: its manifest "
                              f"says format {got!r}, expected 'minidist-sharded-1'")
    return vdir, manifest


def add_arguments(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """``minidist checkpoint convert OLD NEW --trust-pickle``."""
    parser.add_argument("action", choices=("convert",),
                        help="convert: an old (pickled) checkpoint into the data-only format")
    parser.add_argument("old", help="the old checkpoint: a file, or a sharded directory")
    parser.add_argument("new", help="where to write the new one (a file, or a directory)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="required: reading OLD unpickles it, which can run code; "
                             "give it only for a checkpoint you trust")
    return run


def run(ns: argparse.Namespace) -> int:
    try:
        written = convert(ns.old, ns.new, trust_pickle=ns.trust_pickle)
    except (CheckpointError, OSError) as e:
        print(f"minidist checkpoint convert: {e}", file=sys.stderr)
        return 2 if not ns.trust_pickle else 1
    for path in written:
        print(f"wrote {path}")
    return 0
