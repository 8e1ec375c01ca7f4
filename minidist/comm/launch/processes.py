"""The operating system's side of a world: who may start one, the BLAS threads each rank
starts with, ending what a rank started, and how a rank's exit code reads."""
from __future__ import annotations

import contextlib
import os
import signal

import multiprocess

from minidist.comm.errors import NestedWorldError
from minidist.comm.transport.wait import cores_available


def check_can_start(world_size: int) -> None:
    """A world of at least one rank, started by a process that may have children."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if multiprocess.current_process().daemon:
        raise NestedWorldError(
            f"{multiprocess.current_process().name} cannot start a world of its own (a "
            "rank's processes cannot have children): under `minidist run` join the world "
            "this process is in (dist.launched(), then dist.init_process_group()), or run "
            "the script with python")


def end_process_group(pgid: int | None) -> None:
    """Kill every process of the group a rank leads (the rank made it: rank.py)."""
    if pgid is None or pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def threads_per_rank(world_size: int):
    """Start the ranks with cores // N BLAS threads each (at least 1), as
    torchrun does, unless the user set the variable. Otherwise each of N ranks
    starts a BLAS thread per core, N threads share every core, and since
    OpenBLAS's threads spin while they wait, a 512 x 512 matmul that takes 0.1
    ms alone takes tens of milliseconds."""
    threads = str(max(1, cores_available() // world_size))
    added = [var for var in BLAS_THREAD_VARS if var not in os.environ]
    for var in added:
        os.environ[var] = threads   # read by the spawned interpreters' BLAS at start
    try:
        yield
    finally:
        for var in added:
            os.environ.pop(var, None)


def exit_code_text(code: int | None) -> str:
    """``1``, or ``-9 (SIGKILL)`` for a process killed by a signal."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(-code).name})"
    return str(code)
