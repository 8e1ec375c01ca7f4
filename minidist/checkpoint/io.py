"""Atomic checkpoint files: a crash mid-write leaves the previous file readable.

    write to  .name.tmp-<pid>  in the same directory
    flush + fsync              the bytes are on disk, not in the page cache
    os.replace(tmp, name)      one atomic rename: readers see old or new, never half
    fsync the directory        the rename itself survives a power cut

A writer killed with SIGKILL (or a power cut) cannot remove its temporary. The
next write or read of the same name removes every ``.name.tmp-<pid>`` whose
process is gone (``remove_stale_temporaries``), so nothing a killed save left
survives the next save or load.

A file holds a nested dict of arrays and plain values, pickled with the arrays
copied to the host (so a checkpoint saved on a GPU loads on a CPU and back).
Like ``torch.load``, loading unpickles: only load checkpoints you trust.
``sha256`` of the bytes is returned on save and checked on load when given,
so a truncated or swapped file is an error that names it.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import time
from typing import Any

from minidist import backend
from minidist.trace import recorder as trace


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or does not fit the model."""


class _HostArray:
    """An array on its way to or from disk (host copy), told apart from user values."""

    def __init__(self, host: Any):
        self.host = host


def _to_host(obj: Any) -> Any:
    if backend.is_array(obj):
        return _HostArray(backend.to_host(obj).copy())
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj


def _from_host(obj: Any) -> Any:
    if isinstance(obj, _HostArray):
        return backend.from_host(obj.host)
    if isinstance(obj, dict):
        return {k: _from_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_host(v) for v in obj)
    return obj


def _temporary_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.tmp-"


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporaries of ``path`` left by writers that no longer run
    (killed mid-write); returns the names removed. A live writer's is kept."""
    directory = os.path.dirname(os.path.abspath(path))
    prefix = _temporary_prefix(path)
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except FileNotFoundError:
        return []
    removed = []
    for name in names:
        pid = name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and _running(int(pid)):
            continue
        try:
            os.remove(os.path.join(directory, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is always either old or new, whole."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = os.path.join(directory, f"{_temporary_prefix(path)}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)                 # a failed write leaves no debris
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_file(path: str, obj: dict) -> str:
    """Atomically write ``obj`` (arrays copied to the host); returns the sha256 hex digest."""
    start = time.perf_counter()
    data = pickle.dumps(_to_host(obj), protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write_bytes(path, data)
    if trace.active is not None:   # the write's span (trace/)
        trace.active.span("checkpoint write", "checkpoint", start, time.perf_counter(),
                          dict(path=path, bytes=len(data)))
    return hashlib.sha256(data).hexdigest()


def load_file(path: str, sha256: str | None = None, size: int | None = None) -> dict:
    """Read a file written by ``save_file`` (arrays onto the active backend).
    With ``sha256`` / ``size``, a file that does not match is a ``CheckpointError``."""
    remove_stale_temporaries(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file missing: {path}") from None
    if size is not None and len(data) != size:
        raise CheckpointError(f"checkpoint file {path} has {len(data)} bytes, the manifest "
                              f"says {size}: truncated or overwritten")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(f"checkpoint file {path} does not match its sha256 in the "
                              "manifest: corrupt, or from another checkpoint")
    try:
        return _from_host(pickle.loads(data))
    except Exception as e:  # truncated pickles raise several kinds of error
        raise CheckpointError(f"checkpoint file {path} is unreadable "
                              f"({type(e).__name__}: {e}): truncated or corrupt") from None
