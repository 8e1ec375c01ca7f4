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
bools and None; every record is read by ``numpy.lib.format.read_array`` with
``allow_pickle=False``, which refuses object arrays (the one place .npy
pickles); a record must match its index entry (sha256 of its bytes, dtype,
shape) before it is used. Nothing in the file names a function or a class.

Dtypes NumPy's .npy header cannot name (bfloat16 and the fp8 formats of
``ml_dtypes``) are stored as unsigned ints of the same width, bit for bit,
with their name in the index; loading them needs ``ml_dtypes`` installed.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from typing import Any

import numpy as np  # the file format is NumPy's .npy

from minidist.checkpoint.tree import FormatError, flatten, unflatten

FORMAT = "minidist-checkpoint-1"
INDEX = "checkpoint.json"


def _label(path: tuple) -> str:
    """A file-name-safe reminder of a record's key path: ('model', 'fc1.weight') ->
    'model.fc1.weight' (the index, not the name, says where the record goes)."""
    text = ".".join(str(k) for k in path)
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:80] or "value"


def _unsigned_view(a: np.ndarray) -> tuple[np.ndarray, str]:
    """The array as .npy can store it, and the dtype name to restore."""
    try:                                # can a .npy header say this dtype?
        header_ok = np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(a.dtype)) \
            == a.dtype
    except (TypeError, ValueError):
        header_ok = False
    if not header_ok:                   # an ml_dtypes type: bfloat16 is '<V2', fp8 '<f1'
        return a.view(f"u{a.dtype.itemsize}"), a.dtype.name
    return a, a.dtype.name


def _restore_dtype(array: np.ndarray, name: str) -> np.ndarray:
    """Undo ``_unsigned_view``: the unsigned ints of a record back to dtype ``name``."""
    if array.dtype.name == name or array.dtype.kind != "u":
        return array
    try:
        dtype = np.dtype(name)          # known once ml_dtypes is imported
    except TypeError:
        try:
            import ml_dtypes
        except ImportError:
            raise FormatError(f"a record has dtype {name!r}, which needs the ml_dtypes "
                              "package: pip install ml_dtypes") from None
        found = getattr(ml_dtypes, name, None) if name.isidentifier() else None
        if not isinstance(found, type):
            raise FormatError(f"a record has dtype {name!r}, which neither NumPy nor "
                              "ml_dtypes knows") from None
        dtype = np.dtype(found)
    return array.view(dtype) if dtype.itemsize == array.dtype.itemsize else array


def to_bytes(obj: Any) -> bytes:
    """Serialize a tree of arrays and plain values (see tree.py) into one zip archive."""
    structure, arrays = flatten(obj)
    buffer = io.BytesIO()
    records = []
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for i, (path, array) in enumerate(arrays):
            stored, dtype = _unsigned_view(array)
            record = io.BytesIO()
            np.lib.format.write_array(record, stored, allow_pickle=False)
            name = f"{i:05d}-{_label(path)}.npy"
            archive.writestr(name, record.getbuffer())
            records.append(dict(name=name, dtype=dtype, shape=list(array.shape),
                                sha256=hashlib.sha256(record.getbuffer()).hexdigest()))
        index = dict(format=FORMAT, structure=structure, records=records)
        archive.writestr(INDEX, json.dumps(index, allow_nan=False))
    return buffer.getvalue()


def from_bytes(data: bytes) -> Any:
    """Inverse of ``to_bytes``; arrays land on the active backend. A file that is not
    one, or whose records do not match the index, is a ``FormatError`` saying which."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        index = json.loads(archive.read(INDEX))
    except KeyError:
        raise FormatError(f"a zip archive without {INDEX}: not a minidist checkpoint") \
            from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise FormatError(f"not a complete checkpoint archive ({type(e).__name__}: {e}): "
                          "truncated, or another kind of file") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        got = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise FormatError(f"{INDEX} says format {got!r}, expected {FORMAT!r}")
    records = index.get("records")
    if not isinstance(records, list):
        raise FormatError(f"{INDEX} has no list of records")
    arrays = [_read_record(archive, r) for r in records]
    return unflatten(index.get("structure"), arrays)


def _read_record(archive: zipfile.ZipFile, record: Any) -> np.ndarray:
    """One .npy record, checked against its index entry; never unpickles."""
    try:
        name, dtype, shape, digest = (record[k] for k in ("name", "dtype", "shape", "sha256"))
        info = archive.getinfo(name)
    except (TypeError, KeyError):
        raise FormatError(f"index entry {record!r} does not name a record of the archive") \
            from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise FormatError(f"record {name} is compressed; checkpoint records are stored")
    try:
        raw = archive.read(name)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise FormatError(f"record {name} is unreadable ({e}): truncated or corrupt") from None
    if hashlib.sha256(raw).hexdigest() != digest:
        raise FormatError(f"record {name} does not match its sha256 in {INDEX}: corrupt")
    try:
        array = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    except ValueError as e:             # "Object arrays cannot be loaded when ..."
        raise FormatError(f"record {name} is not a plain .npy array ({e})") from None
    if isinstance(dtype, str):
        array = _restore_dtype(array, dtype)
    if array.dtype.name != dtype or list(array.shape) != shape:
        raise FormatError(f"record {name} holds {array.dtype.name} {list(array.shape)}, "
                          f"{INDEX} says {dtype} {shape}")
    return array
