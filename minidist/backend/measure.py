"""Measuring on the active backend: wall time, peak array memory, matmul FLOPs.

    with Timer() as t, MemoryTracker() as mem, MatmulFlopCounter() as flops:
        step()
    t.seconds, mem.peak, flops.flops

Each works the same on NumPy, the guard and CuPy: the timer synchronises the
device, the memory tracker reads tracemalloc on the host and a pool hook on CuPy,
the FLOP counter puts a counting ``matmul`` into ``xp`` for the block.
"""
from __future__ import annotations

import time
import tracemalloc
from typing import Any

from minidist.backend import array_module, get_backend, synchronize, xp


class Timer:
    """Wall-clock timer that synchronises the device on entry and exit.

    >>> with Timer() as t:
    ...     work()
    >>> t.seconds
    """

    def __enter__(self) -> "Timer":
        synchronize()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize()
        self.seconds = time.perf_counter() - self._t0


class MemoryTracker:
    """Peak array memory allocated inside a ``with`` block, in bytes.

    On the CPU backends this uses ``tracemalloc`` (NumPy reports its array
    buffers to it); on CuPy a memory hook that adds up what the pool hands out
    and takes back, in this thread. ``peak`` counts from the bytes in use at
    the start, so freeing an older array makes room without counting.
    """

    def __enter__(self) -> "MemoryTracker":
        self.peak = 0
        if get_backend() == "cupy":
            self._hook = _cupy_peak_hook()
            self._hook.__enter__()
        else:
            self._was_tracing = tracemalloc.is_tracing()
            if not self._was_tracing:
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._base = tracemalloc.get_traced_memory()[0]
        return self

    def sample(self) -> None:
        """Kept for callers that sampled by hand: the peak is tracked throughout, on every backend."""

    def __exit__(self, *exc) -> None:
        if get_backend() == "cupy":
            self._hook.__exit__()
            self.peak = self._hook.peak
        else:
            self.peak = tracemalloc.get_traced_memory()[1] - self._base
            if not self._was_tracing:
                tracemalloc.stop()


class MatmulFlopCounter:
    """FLOPs of every ``xp.matmul`` run inside a ``with`` block (2 per multiply-add).

    A product of (..., M, K) and (..., K, N) costs 2 M N K per matrix of the
    (broadcast) batch: 2 x output elements x K. The counter puts a counting
    ``matmul`` into ``xp`` for the block and takes it out again; minidist's
    autograd ops and attention kernels multiply through ``xp.matmul``, so the
    count is every product a forward and backward ran, recomputations included.
    """

    def __enter__(self) -> "MatmulFlopCounter":
        self.flops = 0
        self.calls = 0
        self._before = xp.__dict__.get("matmul")
        plain = array_module().matmul

        def counting_matmul(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
            out = plain(a, b, *args, **kwargs)
            self.flops += 2 * out.size * a.shape[-1]
            self.calls += 1
            return out
        xp.__dict__["matmul"] = counting_matmul
        return self

    def __exit__(self, *exc) -> None:
        if self._before is None:
            xp.__dict__.pop("matmul", None)
        else:
            xp.__dict__["matmul"] = self._before


def _cupy_peak_hook():
    """A CuPy memory hook keeping the running and peak bytes taken from the pool."""
    import cupy

    class PeakHook(cupy.cuda.MemoryHook):
        def __init__(self):
            self.name = f"minidist_peak_{id(self)}"  # hooks are kept by name: trackers may nest
            self.in_use = self.peak = 0

        def malloc_postprocess(self, mem_size: int = 0, mem_ptr: int = 0, **kwargs) -> None:
            if mem_ptr:  # 0: the allocation failed
                self.in_use += mem_size
                self.peak = max(self.peak, self.in_use)

        def free_postprocess(self, mem_size: int = 0, **kwargs) -> None:
            self.in_use -= mem_size

    return PeakHook()


def memory_in_use() -> int:
    """Bytes of array memory currently held (device pool on CuPy, traced on CPU)."""
    if get_backend() == "cupy":
        import cupy
        return cupy.get_default_memory_pool().used_bytes()
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
