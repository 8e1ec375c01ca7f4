"""One collective call, from its issue to its bytes: what every function of api.py runs.

``_run(group, name, fields, body, async_op)`` takes the group's next collective
tag (in issue order, even when the call runs later), notes the call in the flight
recorder, checks that every rank made the same call (check.py; a body whose own
messages carry the check says so), runs ``body(group, tag)``, records the bytes
it moved in ``group.stats`` and its span in the trace, now or in the background
(work.py). The small helpers beside it give the bodies a contiguous flat view of
an output and describe arrays for the same-call check.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from minidist.backend import xp
from minidist.comm.collectives import work
from minidist.comm.collectives.check import describe, verify_same_call
from minidist.comm.group import ProcessGroup, resolve
from minidist.trace import recorder as trace


def _run(group: ProcessGroup | None, name: str, fields: dict,
         body: Callable[..., None], async_op: bool, checks_itself: bool = False,
         line: str | None = None, args: tuple = ()):
    """Run ``body(group, tag, *args)`` as collective ``name``: the same-call check
    first (unless the body's own messages carry it), the bytes it moved into
    ``group.stats``, now or in the background (work.py)."""
    g = group if isinstance(group, ProcessGroup) else resolve(group)
    tag = g.next_collective_tag()  # taken now, in issue order, even if run later
    number = g.calls              # this call's number in the group, the same on every rank

    def job() -> None:
        start = time.perf_counter()  # the same-call check is part of the collective's time
        text = describe(name, **fields) if line is None else line
        g.transport.record_begin(g.ctx, number, g.ranks, text)  # flight recorder
        if g.check and g.size > 1 and not checks_itself:
            verify_same_call(g, text, tag)
        before = g.stats.snapshot()
        body(g, tag, *args)
        g.stats.record(name, before, fields, time.perf_counter() - start)
        g.transport.record_end()
        if trace.active is not None:   # its span, with g.stats.last's bytes (trace/)
            trace.active.call(name, g.ranks, start, g.stats.last, g.group_desc)

    return work.submit(job, async_op)


def _nothing() -> None:
    pass


def _flat(arr: Any) -> tuple[Any, Callable[[], None]]:
    """A 1-D contiguous view of ``arr`` to work in, and how to write it back."""
    if arr.flags.c_contiguous:
        return arr.reshape(-1), _nothing
    staging = xp.ascontiguousarray(arr).reshape(-1)

    def write_back() -> None:
        arr[...] = staging.reshape(arr.shape)
    return staging, write_back


_dtype_names: dict = {}


def _sig(arr: Any) -> dict:
    dtype = arr.dtype
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = dtype.name  # slow in NumPy: computed once per dtype
    return {"dtype": name, "shape": arr.shape}


def _same_as(arrays: list, ref: Any, what: str, n: int) -> None:
    if len(arrays) != n:
        raise ValueError(f"{what} must hold {n} arrays (one per rank), got {len(arrays)}")
    for a in arrays:
        if a.shape != ref.shape or a.dtype != ref.dtype:
            raise ValueError(f"every array in {what} must have shape {tuple(ref.shape)} and "
                             f"dtype {ref.dtype}, got {tuple(a.shape)} {a.dtype}")
