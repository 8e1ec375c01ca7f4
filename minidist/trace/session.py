"""When recording starts and stops, and which process merges the parts.

Four ways to trace a run, one file at the end:

    minidist run -n 4 --trace run.json train.py     # the launcher merges, failures included
    MINIDIST_TRACE=run.json mpiexec -n 4 python train.py   # rank 0 merges at the end
    MINIDIST_TRACE=run.json python train.py          # one process: it merges at its end
    with minidist.trace.record("run.json"):          # in a script: rank 0 merges on exit
        ...

A rank starts recording when it joins its world (``init_process_group`` calls
``recorder.start_from_env``) and stops when it leaves it
(``destroy_process_group`` calls ``finish``). Whoever merges first waits for
every rank's part to be complete (at most ``WAIT_S``), so that rank 0 does not
merge while rank 3 is still writing. ``MINIDIST_TRACE_MERGE=parent`` tells the
ranks that a process above them (the launcher, a script around
``minidist.launch`` inside ``record``) merges instead.

A script that starts several worlds one after another (a ``World`` per
schedule, ``minidist.launch`` twice) records them all into one file: the
process that starts them records too, numbers them (``MINIDIST_TRACE_WORLD``,
``world_env``) and merges once at its end, so that each world's ranks are
processes of their own in the trace (``world 1 rank 0``, merge.py). A script
of one process under ``MINIDIST_TRACE`` records from the import of minidist
(``record_script_from_env``), so its own modules are in the trace as well.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import multiprocess

from minidist.trace import recorder
from minidist.trace.recorder import WAIT_S, finish  # noqa: F401  (finish: here as before)


_RANK_ENV = (("RANK", "WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def rank_from_env() -> tuple[int, int] | None:
    """(rank, world size) of a process started as a rank, from its environment."""
    for rank_var, size_var in _RANK_ENV:
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return None


@contextlib.contextmanager
def record(path: str) -> Iterator[recorder.Recorder]:
    """Record a trace of what runs inside the block (every rank calls it), and of
    the ranks started inside it (``minidist.launch``); merged into ``path`` on exit
    (``.gz``: gzipped). An exception leaving the block is an instant event."""
    rec = recorder.start(path)
    if rec.rank is None:
        found = rank_from_env()
        if found is not None:
            rec.note_rank(*found)
    saved = {k: os.environ.get(k) for k in ("MINIDIST_TRACE", "MINIDIST_TRACE_MERGE")}
    os.environ["MINIDIST_TRACE"] = path
    if rec.rank is None:   # worlds started in here leave the merge to this process
        os.environ["MINIDIST_TRACE_MERGE"] = "parent"
    try:
        yield rec
    except BaseException as e:
        rec.instant(f"{type(e).__name__}: {e}"[:200], "failure", scope="p")
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if recorder.active is rec:
            finish()


def record_script_from_env() -> None:
    """``MINIDIST_TRACE=run.json python train.py`` where ``train.py`` is one process
    (it starts no world, or starts worlds of its own): record this process from the
    import of minidist to its exit, then merge, as a rank under mpiexec records from
    ``init_process_group`` to its exit. Called when minidist is imported.

    A rank records from when it joins its world instead (``start_from_env``): one
    mpiexec or a launcher started (its rank is in the environment), or one a
    ``World`` is spawning (it imports minidist while it unpickles its task). The
    ``minidist`` command gives its recording up (``discard_script_recording``):
    its ``run`` traces with ``--trace``."""
    path = os.environ.get("MINIDIST_TRACE")
    if not path or recorder.active is not None or rank_from_env() is not None:
        return
    if os.environ.get("MINIDIST_TRACE_MERGE") == "parent":
        return   # a process above this one merges
    if getattr(multiprocess.current_process(), "_inheriting", False):
        return   # being spawned: a rank of a World
    recorder.start(path).from_env = True


def discard_script_recording() -> None:
    """Give up the recording ``record_script_from_env`` started: no part, no merge."""
    rec = recorder.active
    if rec is not None and rec.from_env:
        recorder.stop()
        os.remove(rec.part)


def world_env() -> dict[str, str]:
    """The trace variables for the ranks of a world this process starts (``World``
    calls it): none when nothing is traced. Under ``MINIDIST_TRACE`` this process
    starts recording too, if it was not, and merges at its end (every world in
    one file); each world gets the next index, 0 for the first."""
    path = os.environ.get("MINIDIST_TRACE")
    if not path or rank_from_env() is not None:   # (a rank's own worlds: not numbered)
        return {}
    rec = recorder.active
    if rec is None:
        if os.environ.get("MINIDIST_TRACE_MERGE") == "parent":
            return {}   # a process above this one merges (a launcher's one world)
        rec = recorder.start(path)
    if rec.rank is not None:
        return {}
    return {"MINIDIST_TRACE_MERGE": "parent", "MINIDIST_TRACE_WORLD": str(rec.next_step("world"))}
