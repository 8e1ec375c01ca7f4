"""Doorbells: how a waiting rank sleeps until a peer has news for it.

Polling shared memory is the fastest way to notice a message when every rank
has a core of its own, but with more ranks than cores a polling rank burns the
time its peer needs to produce the message. So a rank that has polled in vain
goes to sleep on its doorbell, a 32-bit counter in the world's segment, with
the Linux futex system call: ``FUTEX_WAIT`` sleeps only if the counter still
holds the value the rank saw before its last look, so a ring that comes in
between is never lost. A peer that publishes a piece to rank r (or frees a
slot r was sending into) increments r's counter and, if r says it is asleep,
calls ``FUTEX_WAKE``.

Where futex is unavailable (not Linux) ``wait`` naps briefly instead. Every
wait has a short timeout as well, so a sleeping rank still looks at the abort
flag and its own deadline regularly.

Layout: 64 bytes per rank (own cache line); int32 word 0 the counter, word 1
the number of threads of that rank asleep on it.
"""
from __future__ import annotations

import ctypes
import platform
import sys
import time

BYTES_PER_RANK = 64
_WORDS_PER_RANK = BYTES_PER_RANK // 4
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall():
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL during the call
        fn = libc.syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return fn


_syscall = _load_syscall()


class Doorbells:
    """The doorbells of every rank of a world, at ``offset`` in a shared buffer."""

    def __init__(self, buf: memoryview, offset: int, world_size: int):
        self.world_size = world_size
        self._words = buf[offset:offset + world_size * BYTES_PER_RANK].cast("i")
        self._anchor = None
        if _syscall is not None:
            self._anchor = ctypes.c_char.from_buffer(buf, offset)  # pins the address
            self._base = ctypes.addressof(self._anchor)

    def value(self, rank: int) -> int:
        return self._words[rank * _WORDS_PER_RANK]

    def ring(self, rank: int) -> None:
        """Tell ``rank`` something changed; wake it if it sleeps."""
        i = rank * _WORDS_PER_RANK
        w = self._words
        w[i] = (w[i] + 1) & 0x7FFFFFFF
        if w[i + 1] and self._anchor is not None:
            _syscall(_SYS_FUTEX, self._base + rank * BYTES_PER_RANK, _FUTEX_WAKE,
                     0x7FFFFFFF, None, None, 0)

    def ring_all(self) -> None:
        for r in range(self.world_size):
            self.ring(r)

    def sleepers(self, rank: int, delta: int) -> None:
        """Add ``delta`` to the count of threads of ``rank`` asleep on its bell."""
        self._words[rank * _WORDS_PER_RANK + 1] += delta

    def wait(self, rank: int, seen: int, timeout: float) -> None:
        """Sleep until ``rank``'s counter differs from ``seen`` (or ``timeout`` s)."""
        if self._anchor is None:
            time.sleep(min(timeout, 1e-4))
            return
        ts = _Timespec(int(timeout), int((timeout % 1.0) * 1e9))
        _syscall(_SYS_FUTEX, self._base + rank * BYTES_PER_RANK, _FUTEX_WAIT, seen,
                 ctypes.byref(ts), None, 0)

    def close(self) -> None:
        self._anchor = None
        self._words.release()
