"""Asynchronous collectives: ``all_reduce(x, async_op=True)`` returns a ``Work``.

One background thread per process runs queued collectives in the order they
were issued, which every rank must share (rank 0's second all-reduce has to
meet rank 1's second all-reduce). NumPy releases the GIL while it copies and
adds large arrays, so the main thread computes while the thread communicates.

A synchronous collective issued while async ones are queued first waits for
them, which keeps the order the same on every rank.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable


class Work:
    """Handle of an asynchronous collective, like torch's ``Work``."""

    def __init__(self, job: Callable[[], None]):
        self._job = job
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._job()
        except BaseException as e:  # re-raised in the thread that calls wait()
            self._error = e
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the collective is done; re-raise its error if it failed."""
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def exception(self) -> BaseException | None:
        return self._error


_state: dict = {"thread": None, "queue": None, "last": None}


def _loop(q: "queue.Queue") -> None:
    while True:
        item = q.get()
        if item is None:
            return
        item._run()


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
    _state["last"] = w
    _state["queue"].put(w)
    return w


def shutdown() -> None:
    """Finish queued work and stop the background thread."""
    thread = _state["thread"]
    if thread is not None:
        _state["queue"].put(None)
        thread.join(timeout=5.0)
    _state.update(thread=None, queue=None, last=None)
