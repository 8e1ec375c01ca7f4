"""The same checkpoint as a safetensors file, where the ``safetensors`` package is installed.

    save_checkpoint("run/ckpt.safetensors", model, opt)     # the name picks the format

    ckpt.safetensors   8 bytes: the header's length; the header, JSON: each tensor's
                       dtype, shape and byte range, and "__metadata__":
                       {"minidist": "<checkpoint.json, as records.py writes it>"};
                       then the tensors' bytes

Hugging Face's format, for weights that tools outside minidist read too. The
tensors are records.py's records by another container: the same names (minus
".npy"), ml_dtypes types stored as unsigned ints, the same index, whose sha256
of a record is here the sha256 of its tensor's bytes. Loading is data only, as
with the zip: ``safetensors`` parses a JSON header and slices the bytes.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from minidist.checkpoint.records import (FORMAT, INDEX, check_index, record_name,
                                         restore_dtype, unsigned_view)
from minidist.checkpoint.tree import FormatError, flatten, unflatten
from minidist.untrusted import MAX_JSON_BYTES

SUFFIX = ".safetensors"


def _library() -> Any:
    try:
        import safetensors.numpy
    except ImportError:
        raise FormatError("safetensors checkpoints need the safetensors package: "
                          "pip install safetensors") from None
    return safetensors.numpy


def is_safetensors(data: bytes) -> bool:
    """A safetensors file starts with its header's length, then the header: '{'."""
    if len(data) < 9 or data[8:9] != b"{":
        return False
    return 8 + int.from_bytes(data[:8], "little") <= len(data)


def to_bytes(obj: Any) -> bytes:
    """Serialize a tree of arrays and plain values (see tree.py) as safetensors."""
    structure, arrays = flatten(obj)
    tensors, records = {}, []
    for i, (path, array) in enumerate(arrays):
        stored, dtype = unsigned_view(array)
        name = record_name(i, path)
        tensors[name] = stored if stored.flags.c_contiguous else stored.copy()  # 0-d kept
        records.append(dict(name=name, dtype=dtype, shape=list(array.shape),
                            sha256=hashlib.sha256(tensors[name].tobytes()).hexdigest()))
    index = dict(format=FORMAT, structure=structure, records=records)
    return _library().save(tensors, metadata={"minidist": json.dumps(index, allow_nan=False)})


def from_bytes(data: bytes, check_records: bool = True) -> Any:
    """Inverse of ``to_bytes``; arrays land on the active backend."""
    length = int.from_bytes(data[:8], "little")
    if length > MAX_JSON_BYTES:
        raise FormatError(f"a safetensors header of {length} bytes, more than the "
                          f"{MAX_JSON_BYTES} allowed: refused")
    try:
        header = json.loads(data[8:8 + length])
        index = json.loads(header["__metadata__"]["minidist"])
    except (ValueError, KeyError, TypeError):
        raise FormatError("a safetensors file without minidist's index in its metadata: "
                          "weights, not a minidist checkpoint") from None
    try:
        tensors = _library().load(data)
    except Exception as e:  # the library raises its own error types
        raise FormatError(f"the safetensors data is unreadable ({e})") from None
    arrays = []
    for record in check_index(index):
        try:
            name, dtype, shape, digest = (record[k] for k in ("name", "dtype", "shape",
                                                              "sha256"))
            array = tensors[name]
        except (TypeError, KeyError):
            raise FormatError(f"{INDEX} entry {record!r} names no tensor of the file") \
                from None
        if check_records and hashlib.sha256(array.tobytes()).hexdigest() != digest:
            raise FormatError(f"tensor {name} does not match its sha256: corrupt")
        array = restore_dtype(array, dtype) if isinstance(dtype, str) else array
        if array.dtype.name != dtype or list(array.shape) != shape:
            raise FormatError(f"tensor {name} holds {array.dtype.name} {list(array.shape)}, "
                              f"{INDEX} says {dtype} {shape}")
        arrays.append(array)
    return unflatten(index.get("structure"), arrays)
