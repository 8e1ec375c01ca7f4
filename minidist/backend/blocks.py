"""Cache blocking: run an elementwise chain on one block of the arrays at a time.

A chain such as GELU's  t = a*a; t *= c; t += c0; t *= a; tanh(t); ...  makes
NumPy sweep the whole array once per step. An activation of a transformer's MLP
(B, T, 4C) is larger than the CPU's cache, so every sweep reads main memory and
writes it back. Cut the arrays into blocks of BLOCK_BYTES and run the whole chain
on one block before the next: the block's operands and temporaries stay in the L2
cache, and only the chain's first reads and last writes go to memory. This is the
CPU's version of what a fused GPU kernel does (one pass, temporaries in registers).

    blocked(chain, *arrays)   chain reads some arrays and writes others in place
    blockwise(fn, x)          a new array, fn(x), made one block at a time

Every element goes through the same operations in the same order, so the result
is bitwise the one of the chain run on the whole arrays (tests/test_blocks.py
checks it). On CuPy a kernel wants the whole array: there is one block.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist import backend
from minidist.backend import xp

BLOCK_BYTES = 256 * 1024  # per array: the few arrays of a chain fit a 1-2 MiB L2 cache


def _flat_blocks(arrays: tuple) -> list | None:
    """Slices that cut the flattened arrays into blocks, or None: run them whole
    (CuPy, arrays of one block, or an array that is not C-contiguous, whose
    flat view would be a copy)."""
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"blocked: the arrays must have one shape, got "
                         f"{[tuple(a.shape) for a in arrays]}")
    if (backend.get_backend() == "cupy" or arrays[0].nbytes <= BLOCK_BYTES
            or not all(a.flags.c_contiguous for a in arrays)):
        return None
    step = max(1, BLOCK_BYTES // max(a.itemsize for a in arrays))
    return [slice(lo, lo + step) for lo in range(0, arrays[0].size, step)]


def blocked(chain: Callable[..., None], *arrays: Any) -> None:
    """Call ``chain(*pieces)`` on matching blocks of ``arrays`` (all of one shape).

    ``chain`` reads some of its arguments and writes the others in place (``out=``).
    The pieces are flat views of the arrays; if any array is not C-contiguous (a
    transposed view, say), the chain runs once on the whole arrays.
    """
    blocks = _flat_blocks(arrays)
    if blocks is None:
        chain(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]                         # views
    for block in blocks:
        chain(*(a[block] for a in flat))


def blockwise(fn: Callable[[Any], Any], x: Any, dtype: Any = None) -> Any:
    """``fn(x)`` for an elementwise ``fn`` whose result has x's shape and ``dtype``
    (default: x's), computed one block at a time into a new array."""
    blocks = _flat_blocks((x,))
    if blocks is None:
        return fn(x)
    out = xp.empty(x.shape, x.dtype if dtype is None else dtype)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    for block in blocks:
        flat_out[block] = fn(flat_x[block])
    return out
