"""The guard's imitation of CuPy's flush-to-zero (``-ftz=true``) for float32.

On CuPy a float32 subnormal (0 < |x| < 2^-126) reads as a zero of its sign in
every arithmetic kernel, comparison and float32 <-> float64 cast, and a result
that would be subnormal is written as zero. What keeps the bits: views, copies,
indexing, ``where``, ``copysign``, ``signbit``, ``isfinite`` / ``isnan`` /
``isinf`` and integer (bit) operations. An H100 run of scripts/ftz_probe.py
found exactly this split.

With ``flush_subnormals(True)`` the guard does the same to NumPy's results, so
code that would lose a subnormal on a GPU loses it on the CPU too, where a test
sees it. Off by default: it adds a few passes over every float32 result.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

_state = {"on": False}

# NumPy functions that keep a float32 subnormal's bits on CuPy as well
KEEPS_BITS = {"where", "copysign", "signbit", "isfinite", "isnan", "isinf", "sort",
              "concatenate", "stack", "reshape", "transpose", "copy", "empty_like",
              "zeros_like", "ones_like", "full_like", "broadcast_to", "take", "asarray",
              "ascontiguousarray", "array", "moveaxis", "swapaxes", "squeeze",
              "expand_dims", "split", "array_split", "pad", "flip", "roll", "tile",
              "repeat", "ravel", "atleast_1d", "atleast_2d", "shares_memory", "empty",
              "zeros", "ones", "full", "arange", "count_nonzero", "nonzero", "flatnonzero"}


def flush_subnormals(on: bool | None = None) -> bool:
    """Turn the imitation on or off (None: leave it); returns whether it is on."""
    if on is not None:
        _state["on"] = bool(on)
    return _state["on"]


def flush(a: Any) -> Any:
    """``a`` with each float32 subnormal replaced by a zero of its sign (others as they are)."""
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        return a
    u = a.view(np.uint32)
    tiny = (u & 0x7F800000) == 0
    if not tiny.any():
        return a
    return np.where(tiny, (u & 0x80000000).view(np.float32), a)


def flush_call(call: Callable, fn: Any, args: Any, kwargs: dict) -> Any:
    """``call(*args, **kwargs)`` as a flushing kernel would run it: float32
    subnormals in, subnormal float32 results out, both read as zeros."""
    if not _state["on"] or getattr(fn, "__name__", "") in KEEPS_BITS:
        return call(*args, **kwargs)
    out = call(*(flush(a) for a in args), **kwargs)
    if isinstance(out, tuple):
        return tuple(flush(o) for o in out)
    return flush(out)


def flush_cast(a: np.ndarray, dtype: Any, *args: Any, **kwargs: Any) -> np.ndarray:
    """``a.astype(dtype)`` as CuPy casts between float32 and float64: flushing."""
    if not _state["on"] or {a.dtype, np.dtype(dtype)} != {np.dtype("float32"), np.dtype("float64")}:
        return a.astype(dtype, *args, **kwargs)
    if a.dtype == np.float32:
        return flush(a).astype(dtype, *args, **kwargs)      # a subnormal input reads as 0
    return flush(a.astype(dtype, *args, **kwargs))          # a subnormal result is written 0
