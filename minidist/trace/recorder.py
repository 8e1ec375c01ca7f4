"""The recorder: one rank's events, in the Chrome Trace Event format, to a part file.

Recording is off unless started; every event site in the package reads::

    from minidist.trace import recorder as trace
    if trace.active is not None:                 # the one branch tracing costs when off
        trace.active.span("all_reduce", "comm", start, end, args)

Events, as Perfetto and chrome://tracing read them (times in microseconds)::

    X  a complete span        {"ph": "X", "name", "cat", "ts", "dur", "tid", "args"}
    i  an instant             {"ph": "i", "name", "cat", "ts", "tid", "s": "t" | "p"}
    s  a flow leaves (send)   {"ph": "s", "id", "cat": "flow", "ts", "tid"}
    f  ... and lands (recv)   {"ph": "f", "id", "cat": "flow", "ts", "tid", "bp": "e"}
    C  a counter              {"ph": "C", "name", "ts", "args": {series: value}}
    M  metadata               {"ph": "M", "name": "thread_name", "tid", "args": {"name"}}

A flow's id is computed by both ends without talking: the n-th message from
rank a to rank b in context c with tag t has id ``flow_id(a, b, c, t, n)``, and
since messages with one tag between one pair arrive in order (transport/base.py),
the sender's n-th send is the receiver's n-th receive.

The clock is ``time.perf_counter`` (CLOCK_MONOTONIC on Linux), shared by every
process of a machine, so spans of different ranks line up; the same clock the
DDP timeline and the pipeline executor already stamp. A rank under MPI also
notes its offset to rank 0's clock (``note_rank``), which the merge adds.

Recording is on the hot path (a module call, a mark of its backward), so an
event is recorded as a *row*, a tuple of its fields with times in integer
nanoseconds, and becomes the dict above only when the part is read (merge.py
``event_of``): no dict is built and no float is printed while the step runs::

    ("X", name, cat, start_ns, end_ns, tid, args)    ("s", id, ts_ns, tid)
    ("i", name, cat, ts_ns, tid, scope, args)        ("f", id, ts_ns, tid)
    ("C", name, ts_ns, values)                       ("M", event)

A message a rank sends to itself (a pipeline's two chunks on one rank) is a
flow on one process; its rows end in ``SELF`` so that the merge names it
"message to itself" and the check does not take it for two flows' ids colliding.

Each process appends its rows to ``<path>.<pid>.part``, a JSON list of rows a
line, written by a thread every ``FLUSH_S`` seconds and when recording ends: a
rank that is killed leaves what it recorded up to ``FLUSH_S`` before. The pid
of the events is set at the merge (merge.py), from the rank the process noted.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from minidist import backend
from minidist.trace.merge import FLOW_MASK, merge, mesh_dim_of, read_part, wait_for_ranks

SELF = "self"             # the last field of a flow row of a message to this rank itself
FLUSH_S = 0.2             # seconds between writes of the buffered events

active: "Recorder | None" = None   # the recorder of this process; None: tracing is off


def flow_id(src: int, dst: int, ctx: int, tag: int, n: int) -> int:
    """The id of the n-th message from global rank src to dst with (ctx, tag)."""
    return hash((src, dst, ctx, tag, n)) & FLOW_MASK   # ints hash alike in every process


def part_path(path: str, pid: int) -> str:
    return f"{path}.{pid}.part"


class Recorder:
    """Buffers this process's events and appends them to its part file."""

    def __init__(self, path: str):
        self.path = path
        self.part = part_path(path, os.getpid())
        self.rank: int | None = None           # set once the process joins a world
        self.world_size = 1
        self.bytes_sent = 0                    # cumulative, for the "bytes sent" counter
        self._events: list[tuple] = []         # rows (module docstring), not yet written
        self._lock = threading.Lock()
        self._tids: dict[int, int] = {}        # thread ident -> small tid (main: 0)
        self._counts: dict[tuple, int] = {}    # (direction, peer, ctx, tag) -> messages
        self._pending: list[tuple] = []        # (recv handle, flow id) not yet landed
        self.modules: Any = None               # module calls' names, backward ends (nn/module_trace.py)
        self._steps: dict[str, int] = {}       # per kind: how many steps so far
        self.on_close: list = []               # called when recording ends (module_trace.py)
        self.from_env = False                  # started for a script by MINIDIST_TRACE (session.py)
        # appended to, never through a link planted at this predictable name
        self._file = open(os.open(self.part, os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                                  os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "a")
        self.tid()  # names the thread that started recording
        # A thread writes the buffered events every FLUSH_S: a rank killed while it
        # computes or sleeps still leaves what it recorded up to then.
        self._closed = threading.Event()
        threading.Thread(target=self._flush_every, name="minidist-trace", daemon=True).start()

    # -- threads and clocks ------------------------------------------------------
    def tid(self, track: str | None = None) -> int:
        """A small id for the calling thread, or the row ``track`` (of no thread), named once."""
        ident = threading.get_ident() if track is None else track
        tid = self._tids.get(ident)
        if tid is None:
            current = threading.current_thread()
            main = current is threading.main_thread() and track is None
            tid = 0 if main else len(self._tids) + 1
            self._tids[ident] = tid
            name = track or ("main" if main else current.name)
            if name == "minidist-comm":
                name = "comm (asynchronous collectives, DDP buckets)"
            self._add(("M", {"ph": "M", "name": "thread_name", "tid": tid,
                             "args": {"name": name}}))
            self._add(("M", {"ph": "M", "name": "thread_sort_index", "tid": tid,
                             "args": {"sort_index": tid}}))
        return tid

    def tid_of(self, ident: int | None) -> int:
        """The tid of the thread ``ident`` (a ``Work.thread``); this thread's if unknown."""
        tid = self._tids.get(ident)
        return self.tid() if tid is None else tid

    now = staticmethod(time.perf_counter)

    def next_step(self, kind: str) -> int:
        """0, 1, 2, ... per ``kind`` ("ddp", "pipeline"): tells steps apart in the summary."""
        n = self._steps.get(kind, 0)
        self._steps[kind] = n + 1
        return n

    # -- events --------------------------------------------------------------------
    def span(self, name: str, cat: str, start: float, end: float, args: dict | None = None,
             tid: int | None = None) -> None:
        """A complete span from ``start`` to ``end`` (perf_counter seconds)."""
        self._events.append(("X", name, cat, int(start * 1e9), int(end * 1e9),
                             self.tid() if tid is None else tid, args))

    def instant(self, name: str, cat: str, args: dict | None = None,
                at: float | None = None, scope: str = "t") -> None:
        """A moment: ``scope`` "t" on this thread, "p" across the whole rank."""
        self._add(("i", name, cat, _ns(self.now() if at is None else at), self.tid(), scope,
                   args))

    def counter(self, name: str, values: dict, at: float | None = None) -> None:
        self._add(("C", name, _ns(self.now() if at is None else at), values))

    def call(self, name: str, ranks: list, start: float, fields: dict, desc: str = "") -> None:
        """The span of a call that began at ``start``: its args ``fields`` (algorithm, dtype, peer,
        bytes...), ``group`` (its ranks) and a mesh's ``mesh_dim`` (merge.py ``mesh_dim_of``);
        then the counters of bytes sent and of live array memory."""
        args = dict(fields, group=list(ranks), **mesh_dim_of(desc))  # a value JSON lacks: str()
        end = self.now()
        self.span(name, "comm", start, end, args)
        self.counter("bytes sent", {"bytes": self.bytes_sent}, at=end)
        self.sample_memory(end)

    def sample_memory(self, at: float | None = None) -> None:
        """The "live arrays" counter: the backend's accounting of array memory
        (the CuPy pool; on the CPU only while tracemalloc traces, else nothing)."""
        live = backend.memory_in_use()
        if live:
            self.counter("live arrays", {"bytes": live}, at=at)

    # -- flows: send -> receive -----------------------------------------------------
    def _nth(self, key: tuple) -> int:
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        return n

    def sent(self, src: int, dst: int, ctx: int, tag: int, nbytes: int) -> None:
        """A message leaves for global rank ``dst``: the flow's start, inside the
        span of the call that sends it."""
        fid = flow_id(src, dst, ctx, tag, self._nth(("to", dst, ctx, tag)))
        self.bytes_sent += nbytes
        row = ("s", fid, _ns(self.now()), self.tid())
        self._add(row if src != dst else row + (SELF,))

    def receiving(self, handle: Any, src: int, dst: int, ctx: int, tag: int) -> None:
        """A receive from global rank ``src`` is posted; its flow ends at ``landed``."""
        fid = flow_id(src, dst, ctx, tag, self._nth(("from", src, ctx, tag)))
        with self._lock:
            self._pending.append((handle, fid if src != dst else (fid, SELF)))

    def landed(self) -> None:
        """End the flows of the receives that have completed: called after a
        wait, inside the span of the call that waited."""
        with self._lock:
            done = [fid for h, fid in self._pending if h.done]
            if not done:
                return
            self._pending = [(h, fid) for h, fid in self._pending if not h.done]
        ts, tid = _ns(self.now()), self.tid()
        for fid in done:   # (fid, SELF): a message this rank sent itself
            self._add(("f", fid, ts, tid) if isinstance(fid, int) else ("f", fid[0], ts, tid, SELF))

    def exchanged(self, src: int, me: int, ctx: int, tag: int) -> None:
        """A message sent and one received from ``src`` at once
        (sendrecv, exchange): the receive's flow ends now."""
        fid = flow_id(src, me, ctx, tag, self._nth(("from", src, ctx, tag)))
        row = ("f", fid, _ns(self.now()), self.tid())
        self._add(row if src != me else row + (SELF,))

    # -- rank, files ----------------------------------------------------------------
    def note_rank(self, rank: int, world_size: int, clock_offset_s: float = 0.0,
                  coords: dict | None = None) -> None:
        """Name this process in the trace: its rank, and its mesh coordinates once known."""
        self.rank, self.world_size = rank, world_size
        args = {"rank": rank, "world_size": world_size, "clock_offset_us": clock_offset_s * 1e6,
                "attempt": int(os.environ.get("MINIDIST_RESTART_COUNT", "0")),
                "world": int(os.environ.get("MINIDIST_TRACE_WORLD", "0"))}   # (session.py)
        if coords:
            args["coords"] = coords
        self._add(("M", {"ph": "M", "name": "minidist_rank", "tid": 0, "args": args}))
        self.flush()   # on disk at once: a rank killed early is still named

    def note_coords(self, coords: dict) -> None:
        """The rank's coordinates on a device mesh, for its name: ``rank 3 (dp 1, pp 1, tp 0)``."""
        self._add(("M", {"ph": "M", "name": "minidist_coords", "tid": 0, "args": coords}))

    def _add(self, row: tuple) -> None:
        self._events.append(row)   # no lock: list.append is atomic, flush deletes a prefix

    def _flush_every(self) -> None:
        while not self._closed.wait(FLUSH_S):
            self.flush()

    def flush(self) -> None:
        """Write the buffered events to the part file."""
        with self._lock:
            n = len(self._events)
            if self._file is None or n == 0:
                return
            events = self._events[:n]
            del self._events[:n]      # events appended meanwhile stay for the next flush
            # one line per flush, a JSON list: one call of the encoder for all of them
            self._file.write(json.dumps(events, separators=(",", ":"), default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Write what is left and mark the part complete (``{"end": true}``)."""
        self._closed.set()
        for callback in self.on_close:
            callback()
        self.landed()
        self.flush()
        with self._lock:
            if self._file is not None:
                self._file.write('{"end":true}\n')
                self._file.close()
                self._file = None


def _ns(t: float) -> int:
    """perf_counter seconds to whole nanoseconds (an int prints faster than a float)."""
    return int(t * 1e9)


# --------------------------------------------------------------------------------
# Starting and stopping.
# --------------------------------------------------------------------------------

def start(path: str) -> Recorder:
    """Record this process's events into ``path``'s part file (until ``stop``)."""
    global active
    if active is not None:
        if active.path == path:
            return active
        raise RuntimeError(f"already recording a trace into {active.path}; "
                           f"stop it before recording into {path}")
    if not path:
        raise ValueError("give the trace a file name, e.g. run.json or run.json.gz")
    active = Recorder(path)
    # a process that ends while recording completes its part, and rank 0 merges (a
    # script under mpiexec that never calls destroy_process_group)
    atexit.register(finish)
    _flush_on_sigterm()
    return active


def stop() -> Recorder | None:
    """Stop recording; the part file is complete. Returns the recorder (or None)."""
    global active
    rec, active = active, None
    if rec is not None:
        rec.close()
        atexit.unregister(finish)
    return rec


WAIT_S = 10.0   # how long the merging rank waits for the others' parts


def finish() -> None:
    """Stop recording; rank 0 (or a process that is no rank) merges unless a
    parent process does."""
    rec = stop()
    if rec is None:
        return
    if os.environ.get("MINIDIST_TRACE_MERGE") == "parent" and rec.rank is not None:
        return
    if rec.rank not in (None, 0):
        return
    if rec.rank == 0:
        wait_for_ranks(rec.path, rec.world_size, WAIT_S)
    if rec.from_env and not recorded_anything(rec):
        os.remove(rec.part)   # (a script that ran no module, step or collective)
        print(f"minidist: MINIDIST_TRACE={rec.path}: this process ran nothing that is "
              f"traced (no module, optimizer step, collective or world), so no trace was "
              f"written", file=sys.stderr)
        return
    merge(rec.path)


def recorded_anything(rec: Recorder) -> bool:
    """Whether the part holds an event beyond the names of threads, or a world was started."""
    if rec._steps.get("world"):
        return True
    events, _ = read_part(rec.part)
    return any(e["ph"] != "M" for e in events)


def start_from_env(rank: int, world_size: int) -> None:
    """Called when a process joins a world: ``MINIDIST_TRACE=run.json`` starts
    recording (``minidist run --trace`` sets it in every rank)."""
    path = os.environ.get("MINIDIST_TRACE")
    if path and active is None:
        start(path)
    if active is not None and active.rank is None:
        active.note_rank(rank, world_size)


def _flush_on_sigterm() -> None:
    """A rank stopped by SIGTERM (the launcher, after another rank failed) writes
    its events first. Only where nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_term(signum, frame):
        rec = active
        if rec is not None:
            rec.instant("stopped (SIGTERM)", "failure", scope="p")
            rec.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_term)
