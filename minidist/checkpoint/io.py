"""Atomic checkpoint files: a crash mid-write leaves the previous file readable.

    create    .name.tmp-<pid>-<random>   in the same directory, O_EXCL: a name nobody
                                         could guess or plant a link at beforehand
    flush + fsync                        the bytes are on disk, not in the page cache
    os.replace(tmp, name)                one atomic rename: readers see old or new
    fsync the directory                  the rename itself survives a power cut

A writer killed with SIGKILL (or a power cut) cannot remove its temporary. The
next write or read of the same name removes every ``.name.tmp-<pid>-<random>``
whose process is gone (``remove_stale_temporaries``), so nothing a killed save
left survives the next save or load.

A file holds a nested dict of arrays and plain values: a zip archive of .npy
records and a JSON index (records.py, tree.py), or the same in a safetensors
file (safetensors_file.py), with the arrays copied to the host, so a
checkpoint saved on a GPU loads on a CPU and back. Loading reads
data only and never unpickles, so a file from anywhere cannot run code: a
pickle (an old-format checkpoint, or a crafted file) is refused with a
``CheckpointError`` that says how to convert one you trust (convert.py).
``sha256`` of the bytes is returned on save and checked on load when given,
so a truncated or swapped file is an error that names it. A file is read as
minidist.untrusted reads one: not through a symbolic link, a regular file only,
no more bytes than the manifest states.
"""
from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
import time
from typing import Any

from minidist.checkpoint import records, safetensors_file
from minidist.checkpoint.tree import FormatError
from minidist.trace import recorder as trace
from minidist.untrusted import Refused, read_regular


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt, unsafe (a pickle, a name that
    leaves the checkpoint, a link, a FIFO) or does not fit the model."""


def read_checkpoint_bytes(path: str, limit: int = sys.maxsize, what: str = "checkpoint file"
                          ) -> bytes:
    """The bytes of ``path``, read as minidist.untrusted reads a file (a regular file, no
    link followed, at most ``limit`` bytes); a ``CheckpointError`` naming it if not."""
    try:
        return read_regular(path, limit, what)
    except FileNotFoundError:
        raise CheckpointError(f"{what} missing: {path}") from None
    except Refused as e:
        raise CheckpointError(str(e)) from None


CONVERT = "minidist checkpoint convert OLD NEW --trust-pickle"


def refuse_pickle(data: bytes, path: str) -> None:
    """A ``CheckpointError`` if ``data`` starts like a pickle (protocol 2 to 5)."""
    if len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        raise CheckpointError(
            f"{path} is a pickle, not a checkpoint in the data-only format. Loading a "
            "pickle can run any code it names, so minidist never unpickles on load. If it "
            "is an old minidist checkpoint from a source you trust, convert it once with "
            f"`{CONVERT}` and load NEW")


def _temporary_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.tmp-"


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporaries of ``path`` left by writers that no longer run
    (killed mid-write); returns the names removed. A live writer's is kept, and so
    is any name not of the form ``.name.tmp-<pid>-<random>``."""
    directory = os.path.dirname(os.path.abspath(path))
    form = re.compile(re.escape(_temporary_prefix(path)) + r"(\d+)(-[0-9a-f]+)?")
    try:
        found = [(n, form.fullmatch(n)) for n in os.listdir(directory)]
    except FileNotFoundError:
        return []
    removed = []
    for name, match in found:
        if match is None:
            continue
        pid = int(match.group(1))
        if pid != os.getpid() and _running(pid):
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
    # mkstemp's recipe (a random name, O_EXCL) with the umask's permissions, and the pid
    # in the name so that the next writer knows whether its owner still runs
    tmp = os.path.join(directory, f"{_temporary_prefix(path)}{os.getpid()}-"
                                  f"{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666)
    try:
        with open(fd, "wb") as f:
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
    """Atomically write ``obj`` (arrays copied to the host); returns the sha256 hex digest.
    A zip of .npy records (records.py), or safetensors if ``path`` ends in .safetensors.
    A value a checkpoint cannot hold is a ``CheckpointError`` naming its key path."""
    container = safetensors_file if path.endswith(safetensors_file.SUFFIX) else records
    start = time.perf_counter()
    try:
        data = container.to_bytes(obj)
    except FormatError as e:
        raise CheckpointError(f"cannot save {path}: {e}") from None
    atomic_write_bytes(path, data)
    if trace.active is not None:   # the write's span (trace/)
        trace.active.span("checkpoint write", "checkpoint", start, time.perf_counter(),
                          dict(path=path, bytes=len(data)))
    return hashlib.sha256(data).hexdigest()


def load_file(path: str, sha256: str | None = None, size: int | None = None) -> Any:
    """Read a file written by ``save_file`` (arrays onto the active backend); never
    unpickles. With ``sha256`` / ``size``, a file that does not match is a
    ``CheckpointError``."""
    remove_stale_temporaries(path)
    data = read_checkpoint_bytes(path, sys.maxsize if size is None else size)
    if size is not None and len(data) != size:
        raise CheckpointError(f"checkpoint file {path} has {len(data)} bytes, the manifest "
                              f"says {size}: truncated or overwritten")
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(f"checkpoint file {path} does not match its sha256 in the "
                              "manifest: corrupt, or from another checkpoint")
    # a safetensors file starts with its header's length, whose bytes may look like a
    # pickle's opening (0x80, protocol): ask the pickle question of the other files only
    container = safetensors_file if safetensors_file.is_safetensors(data) else records
    if container is records:
        refuse_pickle(data, path)
    try:
        return container.from_bytes(data, check_records=sha256 is None)  # else checked above
    except (FormatError, Refused) as e:
        raise CheckpointError(f"checkpoint file {path} is unreadable: {e}") from None
    except RecursionError:
        raise CheckpointError(f"checkpoint file {path} is nested too deeply") from None
