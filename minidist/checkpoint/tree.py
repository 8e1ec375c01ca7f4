"""A state dict as JSON plus a list of arrays: data only, nothing that runs code.

A checkpoint holds nested dicts, lists and tuples whose leaves are arrays or
plain values. ``flatten`` splits such a tree into

    structure   JSON: the nesting, the names, the plain values, and a
                placeholder {"$array": i} where array number i was
    arrays      host NumPy arrays, written as .npy records (records.py)

and ``unflatten`` puts them back. Every value comes back bit for bit, with its
type; what JSON cannot say directly is written as a tagged object:

    value                        JSON
    dict, all keys str           {"key": ...}       (as is)
    dict, other keys (the        {"$dict": [[key, value], ...]}
      optimizer's int indices)
    tuple (Adam's betas)         {"$tuple": [...]}
    int beyond +-2^53 (the RNG   {"$int": "35399562948360463058890781895381311971"}
      state's 128-bit words)     (other JSON readers round such numbers to doubles)
    nan, inf, -inf               {"$float": "0x7ff8000000000000"} (its 64 bits)
    NumPy scalar (np.float32(x)) {"$scalar": i}     (a 0-d record, any dtype)
    array (any backend)          {"$array": i}      (loaded onto the active backend)

Anything else (a function, a class instance, bytes, a set) cannot be saved:
the error names its key path, e.g. ``['extra']['callback']``. Loading builds
only dicts, lists, tuples, str, int, float, bool, None and arrays, whatever
the JSON says: there is no tag that names a type to construct.
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np  # host arrays and NumPy scalars, the leaves of a file

from minidist import backend

_SAFE_INT = 2 ** 53        # every int of magnitude up to this is exact in a double
_TAGS = ("$dict", "$tuple", "$int", "$float", "$scalar", "$array")


class FormatError(ValueError):
    """A value that a checkpoint cannot hold, or a file that is not a checkpoint."""


def key_path(path: tuple) -> str:
    """('optimizer', 'state', 0) -> "['optimizer']['state'][0]"."""
    return "".join(f"[{k!r}]" for k in path) or "the top level"


def flatten(obj: Any) -> tuple[Any, list[tuple[tuple, np.ndarray]]]:
    """``obj`` -> (JSON-able structure, [(key path, host array), ...]). Arrays of any
    backend are copied to the host, so a file saved on a GPU loads on a CPU."""
    arrays: list[tuple[tuple, np.ndarray]] = []
    return _encode(obj, (), arrays), arrays


def _encode(obj: Any, path: tuple, arrays: list) -> Any:
    if backend.is_array(obj) or isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O":             # .npy would pickle its elements
            raise FormatError(f"an array of Python objects at {key_path(path)} cannot be "
                              "saved: a checkpoint holds arrays of numbers and bools")
        arrays.append((path, backend.to_host(obj)))
        return {"$array": len(arrays) - 1}
    if isinstance(obj, np.generic):          # before float: np.float64 is a float
        arrays.append((path, np.asarray(obj)))
        return {"$scalar": len(arrays) - 1}
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj if abs(obj) <= _SAFE_INT else {"$int": str(int(obj))}
    if isinstance(obj, float):
        if math.isfinite(obj):
            return float(obj)                 # repr round-trips every finite double
        return {"$float": f"0x{struct.unpack('<Q', struct.pack('<d', obj))[0]:016x}"}
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, path + (i,), arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, path + (i,), arrays) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v, path + (k,), arrays) for k, v in obj.items()}
        pairs = []
        for k, v in obj.items():
            if backend.is_array(k) or isinstance(k, (np.ndarray, np.generic)):
                raise FormatError(f"the key {k!r} at {key_path(path)} cannot be saved: dict "
                                  "keys in a checkpoint are str, int, float, bool, None or "
                                  "tuples of these")
            pairs.append([_encode(k, path + (k,), arrays), _encode(v, path + (k,), arrays)])
        return {"$dict": pairs}
    raise FormatError(f"{type(obj).__module__}.{type(obj).__qualname__} at {key_path(path)} "
                      "cannot be saved: a checkpoint holds only arrays, NumPy scalars, "
                      "dicts, lists, tuples, str, int, float, bool and None (save the "
                      "object's state_dict(), not the object)")


def unflatten(structure: Any, arrays: list[Any]) -> Any:
    """Inverse of ``flatten``: host array ``arrays[i]`` goes onto the active backend where
    ``{"$array": i}`` is, and ``{"$scalar": i}`` becomes a NumPy scalar."""
    return _decode(structure, (), arrays)


def _decode(obj: Any, path: tuple, arrays: list) -> Any:
    if obj is None or isinstance(obj, (bool, str, int, float)):
        return obj
    if isinstance(obj, list):
        return [_decode(v, path + (i,), arrays) for i, v in enumerate(obj)]
    if not isinstance(obj, dict):
        raise FormatError(f"unexpected {type(obj).__name__} at {key_path(path)}")
    tag = next((t for t in _TAGS if t in obj), None)
    if tag is None:
        return {k: _decode(v, path + (k,), arrays) for k, v in obj.items()}
    if len(obj) != 1:
        raise FormatError(f"{tag} with other keys {sorted(obj)} at {key_path(path)}")
    value = obj[tag]
    if tag == "$tuple" and isinstance(value, list):
        return tuple(_decode(v, path + (i,), arrays) for i, v in enumerate(value))
    if tag == "$dict" and isinstance(value, list):
        out = {}
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise FormatError(f"$dict entry {pair!r} at {key_path(path)} is not [key, value]")
            key = _decode(pair[0], path, arrays)
            try:
                hash(key)
            except TypeError:               # a list, a dict, an array: not a key
                raise FormatError(f"unhashable $dict key at {key_path(path)}") from None
            out[key] = _decode(pair[1], path + (key,), arrays)
        return out
    try:
        if tag == "$int" and isinstance(value, str):
            return int(value, 10)
        if tag == "$float" and isinstance(value, str):
            return struct.unpack("<d", struct.pack("<Q", int(value, 16)))[0]
    except (ValueError, struct.error):      # not a number; over 4300 digits; over 64 bits
        pass
    if tag in ("$array", "$scalar") and type(value) is int and 0 <= value < len(arrays):
        return backend.from_host(arrays[value]) if tag == "$array" else arrays[value][()]
    raise FormatError(f"malformed {tag} {value!r} at {key_path(path)}")
