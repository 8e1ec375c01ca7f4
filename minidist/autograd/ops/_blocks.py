"""Cache blocking: run a chain of elementwise steps one block of the array at a time.

A chain such as GELU's  t = a*a; t *= c; t += c0; t *= a; tanh(t); ...  makes
NumPy sweep the whole array once per step. An activation of a transformer's MLP
(B, T, 4C) is larger than the CPU's cache, so every sweep reads main memory and
writes it back. Cut the arrays into blocks of BLOCK_BYTES and run the whole chain
on one block before the next: the block's operands and temporaries stay in the L2
cache, and only the chain's first reads and last writes go to memory. This is the
CPU's version of what a fused GPU kernel does (one pass, temporaries in registers).

Every element goes through the same operations in the same order, so the result
is bitwise the one of the chain run on the whole arrays (the tests check it).
On CuPy a kernel wants the whole array: there is one block.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist import backend
from minidist.backend import xp

BLOCK_BYTES = 256 * 1024  # per array: the few arrays of a chain fit a 1-2 MiB L2 cache


def blocked(chain: Callable[..., None], *arrays: Any) -> None:
    """Call ``chain(*pieces)`` on matching blocks of ``arrays`` (all of one shape).

    ``chain`` reads some of its arguments and writes the others in place (``out=``).
    The blocks are flat views of C-contiguous arrays; if any array has another
    layout (a transposed view, say), the chain runs once on the whole arrays.
    """
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"blocked: the arrays must have one shape, got "
                         f"{[tuple(a.shape) for a in arrays]}")
    if (backend.get_backend() == "cupy" or arrays[0].nbytes <= BLOCK_BYTES
            or not all(a.flags.c_contiguous for a in arrays)):
        chain(*arrays)
        return
    flat = [a.reshape(-1) for a in arrays]                         # views
    step = max(1, BLOCK_BYTES // max(a.itemsize for a in flat))
    for lo in range(0, flat[0].size, step):
        chain(*(a[lo:lo + step] for a in flat))
