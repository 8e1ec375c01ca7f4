"""Inside a rank: the loop a world's process runs, from its start to the world's end.

``rank_main`` is what ``World`` starts in each process (spawn). It leads a process
group of its own (so the world's teardown ends whatever the rank started), records
its pid in the segment (only it may join as that rank), watches its parent (a rank
whose launcher died removes the segment and exits), and then runs each function the
world sends: the result or the error goes back, and the run is counted finished
(``shm.finish_run``) once the rank's queued sends are written, so a peer still
waiting on it fails at once, naming it, instead of after its timeout.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import dill

from minidist import backend
from minidist.comm.errors import WorldAbortedError
from minidist.comm.launch.output import redirect_this_process
from minidist.comm.launch.report import traceback_from_user_code
from minidist.comm.transport import shm


def _flush_sends(group) -> None:
    """Write out the sends this rank still has queued (the local transport's; MPI's
    own progress delivers them), before the run counts as finished."""
    if group.is_initialized():
        flush = getattr(group.world_group().transport, "flush", None)
        if flush is not None:
            flush()


def rank_main(rank: int, world_size: int, segment_name: str, conn, options: dict,
               streams: tuple | None) -> None:
    os.setpgid(0, 0)      # a group of our own: the world's teardown ends what we start
    if streams is not None:
        redirect_this_process(*streams)
    os.environ.update(options["env"])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MINIDIST_SHM=segment_name)
    segment = shm.attach(segment_name)
    shm.hold_rank(segment, rank, os.getpid())   # only this process may join as the rank
    _watch_parent(segment_name)
    backend.set_backend(options["backend"])
    backend.use_device(rank)  # CuPy: GPU rank mod G; with fewer GPUs than ranks, shared
    from minidist.comm import group
    try:
        if options["init_group"]:
            group.init_process_group("shm", timeout=options["timeout"], check=options["check"])
        if options.get("announce", True):   # a replacement starts on the run at once
            conn.send(("ok", rank))
        while True:
            try:
                payload = conn.recv_bytes()
            except (EOFError, OSError):
                break
            if not payload:
                break
            try:
                fn, args, kwargs = dill.loads(payload)
                reply = ("ok", fn(*args, **kwargs))
                _flush_sends(group)             # nothing half sent when we count the run
            except BaseException as e:
                aborted = isinstance(e, WorldAbortedError)
                if not aborted:
                    shm.set_abort(segment, rank, f"{type(e).__name__}: {e}"[:500])
                reply = ("error", type(e).__name__, traceback_from_user_code(e), aborted)
            shm.finish_run(segment, rank)       # a peer still waiting on us fails now
            try:
                conn.send(reply)
            except Exception as e:  # the result could not be pickled
                conn.send(("error", type(e).__name__,
                           f"rank {rank}: could not send the result back: {e!r}\n", False))
            if reply[0] == "error":
                break  # a world that failed is not reused
    except KeyboardInterrupt:
        pass
    finally:
        group.destroy_process_group()
        shm.close(segment)


def _watch_parent(segment_name: str) -> None:
    """Exit (removing the segment) if the parent process goes away."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.2)
            if os.getppid() != parent:
                shm.unlink(segment_name)
                os.killpg(0, signal.SIGKILL)     # this rank and what it started
                os._exit(1)
    threading.Thread(target=watch, name="minidist-watchdog", daemon=True).start()
