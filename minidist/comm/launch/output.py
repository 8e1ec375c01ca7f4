"""The ranks' output: whole lines, each with its rank, to the console and log files.

    [rank 0] step 10  loss 2.3412
    [rank 1] step 10  loss 2.3412

Each rank's stdout and stderr (file descriptors 1 and 2, so C libraries and
subprocesses are caught too) go into pipes that the launcher reads. One
thread reads every pipe, cuts what comes in into lines, and writes each
complete line with its ``[rank N]`` prefix in one piece: a line is never split
by another rank's output, whatever the ranks' buffering (``PYTHONUNBUFFERED=1``
writes a long print in several pieces; they are joined here). A last line
without a newline is written when the rank's pipe closes.

Log files, as torchrun's ``--log-dir`` / ``--redirects`` / ``--tee``::

    LOG_DIR/attempt_K/rank_N/stdout.log    what rank N printed in attempt K (restart K)
    LOG_DIR/attempt_K/rank_N/stderr.log

``redirects`` and ``tee`` are bit sets of streams (1 stdout, 2 stderr, 3 both):
a redirected stream goes to its file only, a teed one to its file and the
console. Files hold the lines as the rank wrote them, without prefix.
"""
from __future__ import annotations

import os
import selectors
import threading

from multiprocess.connection import Connection

STDOUT, STDERR = 1, 2
LONGEST_LINE = 1 << 16  # a "line" this long without a newline is written as it is


class RankOutput:
    """Pipes for the output of ``world_size`` ranks, and the thread that reads them."""

    def __init__(self, world_size: int, log_dir: str | None = None, attempt: int = 0,
                 redirects: int = 0, tee: int = 0, prefix: bool = True):
        self.world_size, self.prefix = world_size, prefix
        self.redirects, self.tee = redirects, tee
        # Per rank, (read fd, write end) for stdout and for stderr. A write end is
        # a Connection only so that it can be handed to a spawned rank.
        self._pipes = [tuple(_pipe() for _ in (STDOUT, STDERR)) for _ in range(world_size)]
        self._files: dict = {}
        if log_dir is not None:
            for rank in range(world_size):
                folder = os.path.join(log_dir, f"attempt_{attempt}", f"rank_{rank}")
                os.makedirs(folder, exist_ok=True)
                for stream, name in ((STDOUT, "stdout.log"), (STDERR, "stderr.log")):
                    if (redirects | tee) & stream:
                        self._files[rank, stream] = open(os.path.join(folder, name), "wb")
        self._thread: threading.Thread | None = None
        self._threads: list = []     # one more per replacement process (start_more)

    def child_ends(self, rank: int) -> tuple[Connection, Connection]:
        """The write ends a rank puts on its fds 1 and 2 (``redirect_this_process``)."""
        (_, out_w), (_, err_w) = self._pipes[rank]
        return out_w, err_w

    def start(self) -> None:
        """The ranks hold their write ends now: close ours (so that a pipe ends when
        its rank does) and start reading."""
        readers = {}
        for rank, ((out_r, out_w), (err_r, err_w)) in enumerate(self._pipes):
            out_w.close()
            err_w.close()
            readers[out_r] = (rank, STDOUT)
            readers[err_r] = (rank, STDERR)
        self._thread = threading.Thread(target=self._pump, args=(readers,),
                                        name="minidist-output", daemon=True)
        self._thread.start()

    def more_ends(self, rank: int) -> tuple[Connection, Connection]:
        """New pipes for a process that replaces ``rank`` (world.py); its write ends."""
        self._more = (rank, tuple(_pipe() for _ in (STDOUT, STDERR)))
        (_, out_w), (_, err_w) = self._more[1]
        return out_w, err_w

    def start_more(self, rank: int) -> None:
        """The replacement holds its ends: read its pipes too, on a thread of their own."""
        readers = {}
        for stream, (read, write) in zip((STDOUT, STDERR), self._more[1]):
            write.close()
            readers[read] = (rank, stream)
        self._threads.append(threading.Thread(target=self._pump, args=(readers,),
                                              name="minidist-output", daemon=True))
        self._threads[-1].start()

    def _pump(self, readers: dict) -> None:
        pending = {key: b"" for key in readers.values()}
        with selectors.DefaultSelector() as sel:
            for fd in readers:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                for key, _ in sel.select():
                    fd = key.fd
                    who = readers[fd]
                    data = os.read(fd, 65536)
                    if not data:  # the rank closed it (exited): flush a last partial line
                        sel.unregister(fd)
                        os.close(fd)
                        if pending[who]:
                            self._emit(who, pending[who] + b"\n")
                        continue
                    lines = (pending[who] + data).split(b"\n")
                    pending[who] = lines.pop()
                    if len(pending[who]) > LONGEST_LINE:
                        lines.append(pending[who])
                        pending[who] = b""
                    for line in lines:
                        self._emit(who, line + b"\n")

    def _emit(self, who: tuple[int, int], line: bytes) -> None:
        rank, stream = who
        f = self._files.get(who)
        if f is not None:
            f.write(line)
            f.flush()
        if not self.redirects & stream:
            head = f"[rank {rank}] ".encode() if self.prefix else b""
            _write_all(stream, head + line)   # one line, one write: never split

    def close(self, timeout: float = 2.0) -> None:
        """Wait for the pipes to end (the ranks have exited), then close the files."""
        for thread in [self._thread] + self._threads:
            if thread is not None:
                thread.join(timeout)
        for f in self._files.values():
            f.close()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:  # the console went away (`minidist run ... | head`)
            return
        data = data[n:]


def _pipe() -> tuple[int, Connection]:
    read_fd, write_fd = os.pipe()
    return read_fd, Connection(write_fd, readable=False)


def redirect_this_process(out: Connection, err: Connection) -> None:
    """In a rank: send fds 1 and 2 into the launcher's pipes, and flush Python's
    streams at every newline so that lines reach the launcher as they are printed."""
    import sys
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    out.close()
    err.close()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass
