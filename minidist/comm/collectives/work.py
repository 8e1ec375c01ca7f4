"""Asynchronous collectives: ``all_reduce(x, async_op=True)`` returns a ``Work``.

One background thread per process runs queued collectives in the order they
were issued, which every rank must share (rank 0's second all-reduce has to
meet rank 1's second all-reduce). NumPy releases the GIL while it copies and
adds large arrays, so the main thread computes while the thread communicates.

A synchronous collective issued while async ones are queued first waits for
them, which keeps the order the same on every rank.

The timeline it produces, for DDP's backward on one rank (parallel/data/ddp.py;
bucket k's all-reduce is a ring: send a chunk, receive-and-add one, send, copy)::

    main thread  | grad L7 grad L6 | grad L5 grad L4 | ... | grad L0 | wait |
    comm thread        [b0: copy ~~wire~~ add ~~wire~~ copy]  [b1: ...]  [b3]
                       ^ queued when bucket 0 is full        the last bucket

The background thread blocks in calls that release the GIL and use no CPU:
on its doorbell (a futex, comm/transport/doorbell.py) while a peer is behind,
in ``time.sleep`` while pieces are on an emulated wire (link.py). It needs the
CPU only for the copies and additions of the pieces: ``Work.cpu_s`` records
how much. That CPU time comes from the same cores as backward: where each rank
has a spare core it is free, where it has none (2 ranks on 2 cores) the step
takes at least main + communication CPU time, and only the wire time hides
(bench/bench_ddp.py prints both).

The GIL: the thread mostly waits for peers (asleep, without the GIL), then
needs the GIL for a moment to copy the next piece. By default Python makes a
waiting thread wait up to 5 ms for the GIL while another thread runs Python
code (the autograd engine, say), which would stretch every step of a ring by
that much. While collectives run in the background, the switch interval is
``SWITCH_S`` (0.1 ms) instead, from the moment one is queued until the queue
is empty again.

The launch: a collective queued on an idle thread is taken up before ``submit``
returns (the caller waits for the thread to start it, a thread switch). Left to the
scheduler, the woken thread waits for a core while the main threads of 2 ranks hold
both: up to a millisecond or more, measured, longer than the compute a short overlap
has to hide it behind (an MoE layer's shared expert, parallel/expert/). Taken up at
once, its first sends are on the wire while the caller computes, as a collective
launched on a GPU stream is. One queued behind a running one does not wait: the
caller goes on computing (DDP's buckets, one after another).
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Callable

from minidist import backend
from minidist.trace import recorder as trace


class Work:
    """Handle of an asynchronous collective, like torch's ``Work``."""

    def __init__(self, job: Callable[[], None]):
        self._job = job
        self._device = backend.current_device()  # the issuing thread's GPU (CuPy)
        self._done = threading.Event()
        self._taken = threading.Event()        # set when the thread takes it up
        self._error: BaseException | None = None
        self.issued_at = time.perf_counter()   # when it was queued
        self.started_at: float | None = None   # perf_counter when the thread took it up
        self.finished_at: float | None = None  # ... and when it was done
        self.cpu_s = 0.0                       # CPU time the thread spent on it
        self.thread: int | None = None         # the ident of the thread that ran it

    def _run(self) -> None:
        self.started_at = time.perf_counter()
        self._taken.set()
        self.thread = threading.get_ident()
        cpu = time.thread_time()
        try:
            if self._device is not None:
                backend.use_device(self._device)  # CUDA's current device is per thread
            self._job()
        except BaseException as e:  # re-raised in the thread that calls wait()
            self._error = e
        finally:
            self.finished_at = time.perf_counter()
            self.cpu_s = time.thread_time() - cpu
            _count_queued(-1)
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the collective is done; re-raise its error if it failed. While
        tracing, a wait that blocks is a "wait" span of cat "comm" on the waiting
        thread: the communication that no compute hid (trace/summary.py)."""
        start = trace.active.now() if trace.active is not None and not self._done.is_set() else None
        if not self._done.wait(timeout):
            return False
        if start is not None and trace.active is not None:
            trace.active.span("wait", "comm", start, trace.active.now(), {"on": "collective"})
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        return self._error


SWITCH_S = 1e-4  # sys.setswitchinterval while a collective runs in the background

_switch: dict = {"lock": threading.Lock(), "queued": 0, "default": 0.005}
_state: dict = {"thread": None, "queue": None, "last": None}


def _loop(q: "queue.Queue") -> None:
    while True:
        item = q.get()
        if item is None:
            return
        item._run()


def _count_queued(delta: int) -> None:
    """Keep the short switch interval while any collective is queued or running."""
    with _switch["lock"]:
        _switch["queued"] += delta
        if delta > 0 and _switch["queued"] == 1:
            _switch["default"] = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_S)
        elif _switch["queued"] == 0:
            sys.setswitchinterval(_switch["default"])


def idle() -> bool:
    """Is no asynchronous collective queued or running? (A synchronous call may
    then run at once, without ``submit``.)"""
    last = _state["last"]
    return last is None or last._done.is_set()


def submit(job: Callable[[], None], async_op: bool) -> Work | None:
    """Run ``job`` now (async_op=False, returns None) or in the background (returns Work)."""
    if not async_op:
        last = _state["last"]
        if last is not None:
            # Wait for it to finish, but leave its error (if any) to its own wait():
            # it belongs to that call, not to this one.
            last._done.wait()
            _state["last"] = None
        job()
        return None
    if _state["thread"] is None:
        _state["queue"] = queue.Queue()
        _state["thread"] = threading.Thread(target=_loop, args=(_state["queue"],),
                                            name="minidist-comm", daemon=True)
        _state["thread"].start()
    w = Work(job)
    was_idle = idle()
    _state["last"] = w
    _count_queued(+1)  # before the thread can take it: it must not wait 5 ms for the GIL
    _state["queue"].put(w)
    if was_idle:
        w._taken.wait()
    return w


def shutdown() -> None:
    """Finish queued work and stop the background thread."""
    thread = _state["thread"]
    if thread is not None:
        _state["queue"].put(None)
        thread.join(timeout=5.0)
    _state.update(thread=None, queue=None, last=None)
