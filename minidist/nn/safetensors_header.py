"""A safetensors file's header, read and checked before anything is allocated.

A safetensors file is 8 bytes of header length, a JSON header
``{name: {dtype, shape, data_offsets}}`` and the raw bytes. ``read_header`` reads
the header alone (a regular file, no link, at most ``MAX_JSON_BYTES``: untrusted.py)
and checks each entry: a known dtype, a shape of non-negative ints whose element
count fits, and a byte range inside the file of exactly count x itemsize bytes.
``check_headers`` compares them with the (name, shape) pairs a model expects, in
the model's order, stopping at the first problem: so a tiny directory whose
config.json claims a huge model is refused naming its first mismatching tensor,
before the model is built (nn/hf.py).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterator, NamedTuple

from minidist.untrusted import MAX_JSON_BYTES, Refused, element_count, open_regular

# names Hugging Face once saved that are not parameters (the rotary table is recomputed)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# safetensors' dtype names: bytes per element, and the float ones a Llama's weights may be
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class CheckpointMismatch(ValueError):
    """A checkpoint that does not fit the model its config describes."""


class TensorHeader(NamedTuple):
    """One tensor as a safetensors header describes it: nothing read or allocated."""
    dtype: str                  # safetensors' name: "F32", "BF16", ...
    shape: tuple                # non-negative ints

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: Any) -> "TensorHeader":
        """The header of ``value[i]`` or ``value[i, a:b]`` (hf_mixtral's unfusing)."""
        i, *rest = key if isinstance(key, tuple) else (key,)
        shape = self.shape[1:]
        if rest:
            shape = (len(range(*rest[0].indices(shape[0]))),) + shape[1:]
        return TensorHeader(self.dtype, shape)


def read_header(path: str) -> dict[str, TensorHeader]:
    """Every tensor's dtype and shape in the safetensors file ``path``, from its header
    alone (8 bytes of length, then JSON), each checked to lie inside the file."""
    try:
        fd, file_size = open_regular(path, "safetensors file")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: named by the index but missing") from None
    except Refused as err:
        raise CheckpointMismatch(str(err)) from None
    with os.fdopen(fd, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if not 0 < length <= min(MAX_JSON_BYTES, file_size - 8):
            raise CheckpointMismatch(f"{path} is truncated or corrupt: its header claims "
                                     f"{length} bytes of a {file_size}-byte file")
        try:
            header = json.loads(f.read(length))
        except (ValueError, RecursionError) as err:
            raise CheckpointMismatch(f"{path} is truncated or corrupt: {err}") from None
    if not isinstance(header, dict):
        raise CheckpointMismatch(f"{path}: its header is not a JSON object")
    data_bytes = file_size - 8 - length
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            count = element_count(shape, sys.maxsize, f"tensor {name!r} in {path}")
            size = count * ITEMSIZE[dtype]
        except Refused as err:
            raise CheckpointMismatch(str(err)) from None
        except (TypeError, KeyError, ValueError):
            raise CheckpointMismatch(f"{path}: tensor {name!r} has header entry {entry!r:.200}"
                                     f", not {{dtype, shape, data_offsets}} of a known dtype")\
                from None
        if not (isinstance(start, int) and isinstance(end, int)
                and 0 <= start <= end <= data_bytes and end - start == size):
            raise CheckpointMismatch(f"{path}: tensor {name!r} ({dtype} {list(shape)}, {size} "
                                     f"bytes) claims bytes [{start}, {end}) of the "
                                     f"{data_bytes} the file holds: truncated or corrupt")
        out[name] = TensorHeader(dtype, tuple(shape))
    return out


def check_headers(expected: Iterator[tuple[str, tuple]], headers: dict[str, TensorHeader],
                  tie_word_embeddings: bool) -> None:
    """Compare each expected (name, shape) with the headers, in the model's order, and
    raise ``CheckpointMismatch`` naming the first that is missing, of another shape or
    not a float; then any tensor the model does not have. Stops at the first problem,
    so a config claiming a huge model costs one comparison."""
    own = set()
    for name, shape in expected:
        own.add(name)
        found = headers.get(name)
        if found is None:
            raise CheckpointMismatch(f"the checkpoint does not fit the model of its "
                                     f"config.json: missing tensor {name!r} (expected shape "
                                     f"{shape})")
        if found.shape != shape:
            raise CheckpointMismatch(f"the checkpoint does not fit the model of its "
                                     f"config.json: tensor {name!r}: expected shape {shape}, "
                                     f"found {found.shape}")
        if found.dtype not in FLOATS:
            raise CheckpointMismatch(f"tensor {name!r} is {found.dtype}, not a float "
                                     f"({', '.join(FLOATS)})")
    for name, found in headers.items():
        tied_head = name == "lm_head.weight" and tie_word_embeddings
        if name not in own and not tied_head and not name.endswith(IGNORED_SUFFIXES):
            raise CheckpointMismatch(f"the checkpoint does not fit the model of its "
                                     f"config.json: unexpected tensor {name!r} (shape "
                                     f"{found.shape})")
