"""Reading files a stranger may have written: names, files and sizes are checked first.

A checkpoint, a Hugging Face directory or a trace may come from anywhere, so every
loader asks the same three questions before it reads, allocates or removes anything:

    confined_name(directory, name, pattern)  a name read from a file (LATEST's "v3", a
                                             manifest's shard names, an index's file names)
                                             must fully match ``pattern`` (no separator, not
                                             "." or "..") and resolve inside ``directory``,
                                             symbolic links followed: "../../victim" and a
                                             link out of the directory are refused
    read_regular(path, limit)                (open_regular: a descriptor, for a reader of
                                             part of a file) opened without following a symbolic link
                                             (O_NOFOLLOW), checked to be a regular file (a
                                             FIFO would block the reader forever: it is
                                             opened non-blocking and refused), at most
                                             ``limit`` bytes, read to its stated size only
    element_count(shape)                     a shape is a list of non-negative ints whose
                                             product (math.prod: exact, never overflows as
                                             np.prod does) is at most ``limit``

Caps: ``MAX_JSON_BYTES`` for any JSON structure (a manifest, an index, a config, a
checkpoint's ``checkpoint.json`` after decompression), ``MAX_TRACE_BYTES`` for a
trace after decompression. A refusal is a ``Refused`` (a ValueError) naming the
value and the file; each loader turns it into its own error (``CheckpointError``).
Imports nothing of the package: every layer that reads files may use it.
"""
from __future__ import annotations

import errno
import math
import os
import re
import stat
from typing import Any

MAX_JSON_BYTES = 64 << 20      # 64 MiB: any JSON a loader parses (a manifest, an index)
MAX_TRACE_BYTES = 1 << 30      # 1 GiB: a trace, decompressed (a gzip of zeros inflates 1000x)


class Refused(ValueError):
    """A file, or a value read from one, that a loader will not act on."""


def confined_name(directory: str, name: Any, pattern: str, what: str) -> str:
    """``directory/name``, once ``name`` (read from ``what``) is a plain name fully
    matching ``pattern`` that resolves inside ``directory``."""
    if not isinstance(name, str) or name in (".", "..") or "/" in name or "\0" in name \
            or (os.altsep and os.altsep in name) or not re.fullmatch(pattern, name):
        raise Refused(f"{what} names {name!r}, which is not a plain name of the form "
                      f"{pattern}: refused (nothing outside {directory} is read)")
    path = os.path.join(directory, name)
    root = os.path.realpath(directory)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise Refused(f"{what} names {name!r}, which resolves outside {directory} (a "
                      f"symbolic link?): refused")
    return path


def open_regular(path: str, what: str = "file") -> tuple[int, int]:
    """(descriptor, size) of the regular file ``path``, opened for reading without
    following a link and without blocking on a FIFO; the caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{what} {path} is a symbolic link, which a loader does not "
                          f"follow: refused") from None
        raise                                   # FileNotFoundError: the caller names it
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Refused(f"{what} {path} is not a regular file (a FIFO, device or "
                      f"directory): refused")
    os.set_blocking(fd, True)
    return fd, info.st_size


def read_regular(path: str, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (not a link, FIFO, device or directory),
    refused when it holds more than ``limit`` bytes."""
    fd, size = open_regular(path, what)
    try:
        if size > limit:
            raise Refused(f"{what} {path} has {size} bytes, more than the "
                          f"{limit} allowed: refused")
        chunks, left = [], size                  # the size stated when it was opened
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break                            # shrank meanwhile: the caller sees short
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_capped(f: Any, limit: int, what: str) -> bytes:
    """Everything a (decompressing) file object yields, refused past ``limit`` bytes:
    a small compressed file cannot make the reader hold gigabytes."""
    data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{what} decompresses to more than {limit} bytes: refused")
    return data


def element_count(shape: Any, limit: int, what: str) -> int:
    """The number of elements of ``shape`` (a list of non-negative ints), refused when
    the shape is malformed or the count exceeds ``limit``."""
    if not isinstance(shape, (list, tuple)) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise Refused(f"{what} has shape {shape!r}: not a list of non-negative ints")
    count = math.prod(shape)
    if count > limit:
        raise Refused(f"{what} has shape {list(shape)} ({count} elements), more than the "
                      f"{limit} allowed: refused")
    return count
