"""The checkpoint file: a zip archive of .npy records beside one JSON index.

    ckpt.npz
      checkpoint.json                 {"format": "minidist-checkpoint-1",
                                       "structure": {...},       (tree.py: names, plain
                                                                  values, {"$array": i})
                                       "records": [{"name": "00000-model.fc1.weight.npy",
                                                    "dtype": "float64", "shape": [6, 5],
                                                    "sha256": "9f86..."}, ...]}
      00000-model.fc1.weight.npy      NumPy's .npy format: a header (dtype, shape) and
      00001-model.fc1.bias.npy        the array's bytes, C order
      ...

Records are stored, not compressed (ZIP_STORED, as ``numpy.savez`` does), so
``numpy.load("ckpt.npz")`` opens the file too. Why loading cannot run code:
the index is parsed by ``json``, which builds only dicts, lists, str, numbers,
bools and None; a record's header is parsed by NumPy's .npy header readers, an
object dtype (the one place .npy pickles, what ``allow_pickle=False`` refuses)
is refused, and its bytes become numbers through ``numpy.frombuffer``. A record
must say the dtype and shape its index entry says, and be that long, before
anything is allocated (a crafted header cannot ask for a terabyte: the shape's
non-negative dimensions multiply, exactly, to what the record's bytes hold), and
match its sha256; the index, which may be DEFLATE-compressed, is inflated up to
``MAX_JSON_BYTES`` (64 MiB) only. Nothing in the file names a function or a class.

Dtypes NumPy's .npy header cannot name (bfloat16 and the fp8 formats of
``ml_dtypes``) are stored as unsigned ints of the same width, bit for bit,
with their name in the index; loading them needs ``ml_dtypes`` installed.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import sys
import zipfile
from typing import Any

import numpy as np  # the file format is NumPy's .npy

from minidist.backend.dtypes import named_dtype
from minidist.checkpoint.tree import FormatError, flatten, unflatten
from minidist.untrusted import MAX_JSON_BYTES, Refused, element_count, read_capped

FORMAT = "minidist-checkpoint-1"
INDEX = "checkpoint.json"


def record_name(i: int, path: tuple) -> str:
    """Record i's name, with a file-name-safe reminder of its key path:
    (3, ('model', 'fc1.weight')) -> '00003-model.fc1.weight' (the index, not the
    name, says where the record goes)."""
    text = ".".join(str(k) for k in path)
    return f"{i:05d}-" + (re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80] or "value")


def unsigned_view(a: np.ndarray) -> tuple[np.ndarray, str]:
    """The array as .npy can store it, and the dtype name to restore."""
    try:                                # can a .npy header say this dtype?
        header_ok = np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(a.dtype)) \
            == a.dtype
    except (TypeError, ValueError):
        header_ok = False
    if not header_ok:                   # an ml_dtypes type: bfloat16 is '<V2', fp8 '<f1'
        return a.view(f"u{a.dtype.itemsize}"), a.dtype.name
    return a, a.dtype.name


def restore_dtype(array: np.ndarray, name: str) -> np.ndarray:
    """Undo ``unsigned_view``: the unsigned ints of a record back to dtype ``name``."""
    if array.dtype.name == name:
        return array
    try:
        dtype = named_dtype(name)
    except ValueError as e:
        raise FormatError(f"a record's {e}") from None
    if dtype.hasobject or dtype.itemsize != array.dtype.itemsize:
        raise FormatError(f"a record of {array.dtype.name} cannot hold {name}")
    return array.view(dtype)


def to_bytes(obj: Any) -> bytes:
    """Serialize a tree of arrays and plain values (see tree.py) into one zip archive."""
    structure, arrays = flatten(obj)
    buffer = io.BytesIO()
    records = []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for i, (path, array) in enumerate(arrays):
            stored, dtype = unsigned_view(array)
            record = io.BytesIO()
            np.lib.format.write_array(record, stored, allow_pickle=False)
            name = record_name(i, path) + ".npy"
            archive.writestr(name, record.getbuffer())
            records.append(dict(name=name, dtype=dtype, shape=list(array.shape),
                                sha256=hashlib.sha256(record.getbuffer()).hexdigest()))
        index = dict(format=FORMAT, structure=structure, records=records)
        archive.writestr(INDEX, json.dumps(index, allow_nan=False))
    return buffer.getvalue()


def from_bytes(data: bytes, check_records: bool = True) -> Any:
    """Inverse of ``to_bytes``; arrays land on the active backend. A file that is not
    one, or whose records do not match the index, is a ``FormatError`` saying which.
    ``check_records=False`` skips the records' sha256s (the caller checked the whole
    file's); their dtypes, shapes and zip CRCs are still checked."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        with archive.open(INDEX) as f:   # (it may be compressed: capped as it inflates)
            index = json.loads(read_capped(f, MAX_JSON_BYTES, INDEX))
    except Refused as e:
        raise FormatError(str(e)) from None
    except KeyError:
        raise FormatError(f"a zip archive without {INDEX}: not a minidist checkpoint") \
            from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise FormatError(f"not a complete checkpoint archive ({type(e).__name__}: {e}): "
                          "truncated, or another kind of file") from None
    arrays = [_read_record(archive, r, check_records) for r in check_index(index)]
    return unflatten(index.get("structure"), arrays)


def check_index(index: Any) -> list:
    """The records of a checkpoint index, once its format is known."""
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise FormatError(f"{INDEX} says format {got!r}, expected {FORMAT!r}")
    records = index.get("records")
    if not isinstance(records, list):
        raise FormatError(f"{INDEX} has no list of records")
    return records


class _HashingReader:
    """A file wrapper that hashes what is read through it (one pass over the bytes)."""

    def __init__(self, f: Any, check: bool):
        self.f, self.hash = f, hashlib.sha256() if check else None

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        if self.hash is not None:
            self.hash.update(chunk)
        return chunk


def _read_record(archive: zipfile.ZipFile, record: Any, check: bool) -> np.ndarray:
    """One .npy record, checked against its index entry before any array is allocated;
    never unpickles (an object dtype is refused)."""
    try:
        name, dtype, shape, digest = (record[k] for k in ("name", "dtype", "shape", "sha256"))
        info = archive.getinfo(name)
    except (TypeError, KeyError):
        raise FormatError(f"index entry {record!r} does not name a record of the archive") \
            from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise FormatError(f"record {name} is compressed; checkpoint records are stored")
    try:
        with archive.open(name) as f:
            reader = _HashingReader(f, check)
            header = _read_header(reader, name)
            stored, order, count = _check_header(header, name, dtype, shape, info.file_size)
            data = reader.read(stored.itemsize * count)
            rest = reader.read()                # to the end: the zip checks its CRC there
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise FormatError(f"record {name} is unreadable ({e}): truncated or corrupt") from None
    if check and reader.hash.hexdigest() != digest:
        raise FormatError(f"record {name} does not match its sha256 in {INDEX}: corrupt")
    if rest:
        raise FormatError(f"record {name} has bytes after its array: corrupt")
    array = np.frombuffer(data, dtype=stored).reshape(shape, order=order).copy(order=order)
    return restore_dtype(array, dtype)


def _read_header(reader: Any, name: str) -> tuple:
    """(shape, fortran_order, dtype) from a .npy header, versions 1.0 and 2.0."""
    try:
        version = np.lib.format.read_magic(reader)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(reader)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(reader)
    except ValueError as e:
        raise FormatError(f"record {name} is not a .npy array ({e})") from None
    raise FormatError(f"record {name} is .npy version {version}; 1.0 and 2.0 are read")


def _check_header(header: tuple, name: str, dtype: Any, shape: Any,
                  file_size: int) -> tuple[np.dtype, str, int]:
    """The header must say what the index says, and the record must be that long:
    (stored dtype, order, element count), checked before anything is allocated."""
    got_shape, fortran, stored = header
    if stored.hasobject:                # elements would be pickles: never read
        raise FormatError(f"record {name} is an array of Python objects, which a "
                          "checkpoint never holds: refused")
    if not isinstance(dtype, str) or list(got_shape) != shape or \
            stored.name not in (dtype, f"uint{8 * stored.itemsize}"):
        raise FormatError(f"record {name} holds {stored.name} {list(got_shape)}, {INDEX} "
                          f"says {dtype} {shape}")
    try:                                # math.prod: exact, where np.prod would overflow
        count = element_count(shape, sys.maxsize, f"record {name}")
    except Refused as e:
        raise FormatError(str(e)) from None
    if stored.itemsize * count > file_size:
        raise FormatError(f"record {name} is shorter than a {stored.name} "
                          f"{list(got_shape)} array: truncated or corrupt")
    return stored, "F" if fortran else "C", count
