"""The training state as one byte buffer, so that healing sends it in one message.

The state is whatever the user's ``state_dict()`` returns (torchft's contract):
nested dicts, lists and tuples whose leaves are arrays (parameters, optimizer
moments) or plain values (the step, hyperparameters, an RNG's state, a sampler's
epoch). ``pack_state`` lays it out as

    buffer = skeleton | pad | array_0 | pad | array_1 | pad | ... | array_{n-1}

- the skeleton: the state with array i replaced by
  ``{"__array__": i, "shape": ..., "dtype": ..., "offset": o_i}`` (the dtype by its
  name, so that ml_dtypes' bfloat16 and float8 come back as themselves), written with
  ``marshal`` (Python's own format for plain values, the one .pyc files use; both ends
  run the same interpreter): dicts, lists, tuples, ints, floats (every bit, inf and nan
  too), strings, bytes, None; nothing it reads back is run. A NumPy scalar travels as a
  0-d array (``"__scalar__": True``) and comes back a scalar of its type; any other
  value is refused where the state is packed, with its place in the state. ``repr`` read back with
  ``ast.literal_eval`` would do the same, but parsing is slow: 0.4 ms for the 1.8 kB
  skeleton of demo 27's state at width 256, a tenth of the transfer on its link.
- array i: its bytes, C order, at up(len(skeleton)) + o_i. o_i counts from the first
  array's start, so the skeleton's length does not depend on itself; every start is a
  multiple of ALIGN, so the view of the bytes as the array's dtype is aligned (CuPy's
  kernels and NumPy's fast paths want it).

    o_0 = 0,  o_{i+1} = up(o_i + nbytes_i),  len(buffer) = up(len(skeleton)) + o_n
    up(x) = ALIGN * ceil(x / ALIGN)

``unpack_state(buffer, len(skeleton))`` gives the state back, each array a copy of its
bytes: bit-identical to the packed one, owning its memory (nothing aliases the buffer);
``copy=False`` gives each array as a view of its own bytes in the buffer instead (what
the healed replica loads: its buffer is its own).
"""
from __future__ import annotations

import marshal
import math
from collections.abc import Mapping
from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.backend.dtypes import is_numpy_scalar, named_dtype

ARRAY = "__array__"     # the key that marks an array's place in the skeleton
SCALAR = "__scalar__"   # the key that marks that array as a NumPy scalar of the state
ALIGN = 16              # bytes: the widest itemsize (complex128)


def split_state(state: Any, arrays: list) -> Any:
    """The skeleton of ``state``: its arrays appended to ``arrays``, each replaced by
    a record of its index, shape and dtype; mappings become plain dicts. A NumPy
    scalar (a step kept as np.int64) travels as a 0-d array and comes back a scalar."""
    if backend.is_array(state):
        arrays.append(state)
        return {ARRAY: len(arrays) - 1, "shape": tuple(state.shape), "dtype": state.dtype.name}
    if is_numpy_scalar(state):
        record = split_state(backend.from_host(state), arrays)
        return {**record, SCALAR: True}
    if isinstance(state, Mapping):
        return {key: split_state(value, arrays) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(split_state(value, arrays) for value in state)
    return state


def join_state(skeleton: Any, arrays: list) -> Any:
    """The state ``split_state`` took apart: each array record replaced by its array."""
    if isinstance(skeleton, dict):
        if ARRAY in skeleton:
            array = arrays[skeleton[ARRAY]]
            return backend.to_host(array)[()] if skeleton.get(SCALAR) else array
        return {key: join_state(value, arrays) for key, value in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(join_state(value, arrays) for value in skeleton)
    return skeleton


def encode_skeleton(skeleton: Any) -> bytes:
    """The skeleton's bytes (``split_state``'s plain values only); TypeError naming the
    first value of another kind, where it is in the state."""
    try:
        return marshal.dumps(skeleton)
    except ValueError:
        path, value = _unplain(skeleton, "state")
        raise TypeError(f"{path} is a {type(value).__name__}, which the healing buffer cannot "
                        "carry: a state_dict() holds arrays and plain values (dict, list, "
                        "tuple, int, float, complex, str, bytes, bool, None); turn it into "
                        "one of those in state_dict and back in load_state_dict") from None


def _unplain(value: Any, path: str) -> tuple[str, Any]:
    """(where, what) of the first value in ``value`` that marshal cannot write."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unplain(item, f"{path}[{key!r}]")
            if found:
                return found
        return ()
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _unplain(item, f"{path}[{i}]")
            if found:
                return found
        return ()
    try:
        marshal.dumps(value)
        return ()
    except ValueError:
        return path, value


def decode_skeleton(data: bytes) -> Any:
    """The skeleton ``encode_skeleton`` wrote."""
    return marshal.loads(data)


def _up(x: int) -> int:
    return -(-x // ALIGN) * ALIGN


def pack_state(state: Any) -> tuple[Any, int]:
    """(the buffer, uint8 (len,), the skeleton's length in bytes): ``state`` laid out
    as the module docstring says."""
    arrays: list = []
    skeleton = split_state(state, arrays)
    records = _records(skeleton)
    end = 0                                  # offsets from the first array's start
    for record, array in zip(records, arrays):
        record["offset"], end = end, _up(end + int(array.nbytes))
    text = encode_skeleton(skeleton)
    base = _up(len(text))
    buffer = xp.zeros(base + end, dtype="uint8")                               # (len,)
    buffer[:len(text)] = backend.from_host(memoryview(text), dtype="uint8")
    for record, array in zip(records, arrays):
        start = base + record["offset"]
        buffer[start:start + int(array.nbytes)] = (
            xp.ascontiguousarray(array).reshape(-1).view("uint8"))
    return buffer, len(text)


def unpack_state(buffer: Any, skeleton_bytes: int, copy: bool = True) -> Any:
    """The state ``pack_state`` laid out in ``buffer``; each array a copy of its bytes,
    or with ``copy=False`` a view of them: for a buffer that nothing else holds (the one
    heal.py received into), whose arrays never overlap, a copy per array would only
    move the whole state once more before ``load_state_dict`` copies it in place."""
    skeleton = decode_skeleton(bytes(backend.to_host(buffer[:skeleton_bytes])))
    base, arrays = _up(skeleton_bytes), []
    for record in _records(skeleton):
        dtype = named_dtype(record["dtype"])     # by name: bfloat16's dtype.str is '<V2'
        start = base + record["offset"]
        raw = buffer[start:start + dtype.itemsize * math.prod(record["shape"])]  # (n,) uint8
        array = raw.view(dtype).reshape(record["shape"])
        arrays.append(array.copy() if copy else array)
    return join_state(skeleton, arrays)


def _records(skeleton: Any) -> list:
    """The skeleton's array records, in the order of their indices."""
    records: list = []
    _array_records(skeleton, records)
    return sorted(records, key=lambda r: r[ARRAY])


def _array_records(skeleton: Any, out: list) -> None:
    if isinstance(skeleton, dict):
        if ARRAY in skeleton:
            out.append(skeleton)
            return
        skeleton = list(skeleton.values())
    if isinstance(skeleton, (list, tuple)):
        for value in skeleton:
            _array_records(value, out)
