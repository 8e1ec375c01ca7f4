"""Single-copy reads from another process's memory (Linux cross-memory attach).

A message through shared memory is copied twice: the sender copies it into a
slot, the receiver copies it out (local.py). When the receiver knows where the
bytes lie in the sender's memory, Linux's ``process_vm_readv`` (since Linux 3.2;
the "CMA" single-copy path MPICH and Open MPI take for large messages between
processes of one machine) copies them straight from the sender's address space
into the receiver's array: one copy instead of two, and no slot to wait for.

    read(pid, address, out)     # out[:] = the out.nbytes bytes at address in process pid

The sender must keep those bytes alive and unchanged until the reader is done,
so a collective that reads this way publishes (pid, address) in its same-call
check and ends with an exchange saying every read is over (alltoall.py).

Only host arrays can be read so (not CuPy's device memory), and only where the
kernel lets a process read its peers (same user; Yama's ``ptrace_scope`` = 1 or
a container's seccomp filter may forbid it). A failed read returns False
instead of raising, so that the caller can agree with its peers to take the
two-copy way. ``MINIDIST_SINGLE_COPY=0`` turns the single-copy way off.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any

from minidist import backend


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load_readv():
    """libc's process_vm_readv with its signature, or None where there is none."""
    if os.environ.get("MINIDIST_SINGLE_COPY", "1") == "0" or not os.uname().sysname == "Linux":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]
    return fn


_readv = _load_readv()


def available() -> bool:
    """Can this process try single-copy reads (Linux, libc has the call, not turned off)?"""
    return _readv is not None


def host_address(arr: Any) -> int | None:
    """The address of a C-contiguous array in this process's host memory, or
    None when it has none (a device array, or a strided one)."""
    if backend.get_backend() == "cupy" and backend.is_array(arr):
        return None  # device memory: another process cannot read it this way
    host = backend.to_host(arr)  # a host array as it is (CuPy's staged copies too); a view
    if not host.flags.c_contiguous:
        return None
    try:  # a quarter of the time of __array_interface__, for a writable buffer
        return ctypes.addressof(ctypes.c_char.from_buffer(host))
    except (TypeError, ValueError):  # read-only, or empty
        return host.__array_interface__["data"][0]


def read(pid: int, address: int, out: Any) -> bool:
    """Copy ``out.nbytes`` bytes at ``address`` in process ``pid`` into the
    contiguous host array ``out``. True when all bytes came; False when the
    kernel refused (permission, no such process, bad address)."""
    local = host_address(out)
    done, total = 0, out.nbytes
    while done < total and local is not None:
        here = _IOVec(local + done, total - done)
        there = _IOVec(address + done, total - done)
        got = _readv(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if got <= 0:
            return False
        done += got  # the kernel may stop early (at a page it cannot map): go on
    return done == total

