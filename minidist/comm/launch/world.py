"""Start a world of processes, run functions on it, and bring it down loudly.

    results = minidist.launch(fn, 4, x)     # fn(x) on 4 ranks -> [r0, r1, r2, r3]

    with World(4) as world:                 # keep the processes between calls
        world.run(fn_a)
        world.run(fn_b, 1, 2)

How a world lives and dies:

- The parent creates the shared-memory segment, then starts the ranks with the
  ``spawn`` method (a fresh interpreter; nothing is inherited through fork, as
  CUDA requires). Each rank attaches the segment by name and joins the group.
- ``run`` sends the function (pickled with dill, so closures work; importable
  modules by reference, payload.py) to every rank over a pipe and collects the
  return values.
- If a rank raises, it marks the world as aborted in shared memory, so ranks
  blocked on it stop at once with ``WorldAbortedError``. The parent waits a
  moment for the others to report, terminates the rest, removes the segment
  and raises ``RankFailedError`` with the failing rank and its traceback.
- A rank that dies without a word (killed, ``os._exit``) is seen through its
  process sentinel and treated the same way. The sentinel is ready once the kernel
  has torn the process down (its memory unmapped): the earliest the operating system
  tells anyone, a millisecond or more after a SIGKILL. ``noticed`` keeps when
  (rank -> ``time.monotonic()``).
- Ranks that are still running when the world is stopped (computing, asleep:
  never in a collective that could see the abort) are listed as stopped, so the
  error lists every rank.
- With ``fault_tolerant=True`` a rank that dies without a word does not stop
  the world: it is marked dead in the segment (``shm.mark_died``), so a survivor
  waiting in a collective of it fails at once with ``PeerDiedError`` and may go on
  without it (parallel/fault_tolerance/); ``run`` returns ``RankLost`` in its place.
  A rank that raises still stops the world: an error is a bug, not a lost machine.
  With ``replacements=K`` the world starts a new process for each of the first K
  ranks that die, once every other running rank has let go of the dead one
  (comm/transport/replace.py); it runs the same function from the start, as the
  same rank, and fault tolerance heals it from a live peer. ``replaced`` lists them.
- A ``run`` that outlives ``run_timeout`` blames no rank: it raises
  ``WorldTimeoutError`` with the ranks still running and each one's last
  communication call, read from the flight recorder in shared memory
  (transport/flight.py), which a stuck rank cannot withhold.
- With ``output`` (output.py) the ranks' stdout and stderr come back through
  pipes, as whole lines prefixed with ``[rank N]``, and into log files.
- Ctrl-C in the parent stops every rank. A rank whose parent disappears
  removes the segment and exits (a watchdog thread checks every 0.2 s).
- Each rank leads a process group of its own, so that what it starts (a
  ``subprocess`` still running when it returns) ends with the world: closing
  it kills every rank's group.
- Each rank records its pid in the segment (shm.py's rank records), so a
  process it starts, which inherits ``MINIDIST_SHM`` and ``RANK``, cannot join
  the world as a second copy of it (``NotThisRankError``); and counts the runs
  it returned from, so that a peer waiting for a message from a rank that has
  already returned fails at once naming it (``PeerFinishedError``), instead of
  waiting out its timeout and blaming itself.
"""
from __future__ import annotations

import atexit
import time
from typing import Any, Callable, NamedTuple

import multiprocess
from multiprocess.connection import wait as wait_any

from minidist import backend
from minidist.comm.transport import flight, shm
from minidist.comm.errors import RankFailedError, WorldTimeoutError
from minidist.comm.launch import payload
from minidist.comm.launch.output import RankOutput
from minidist.comm.launch.processes import (check_can_start, end_process_group,
                                            exit_code_text, threads_per_rank)
from minidist.comm.launch.rank import rank_main
from minidist.comm.launch.replacement import Respawner
from minidist.comm.transport.link import link_bytes_per_s, topology
from minidist.trace.session import world_env

GRACE_S = 1.0  # after a failure, how long the other ranks get to report before being killed
REPLACE_POLL_S = 0.02  # how often the launcher looks whether a dead rank may be replaced


class RankLost(NamedTuple):
    """What ``World(fault_tolerant=True).run`` returns for a rank that died."""
    rank: int
    exit_code: int      # -9: killed by SIGKILL

    def __str__(self) -> str:
        return f"rank {self.rank} lost (exit code {exit_code_text(self.exit_code)})"


def _create_segment(world_size: int, nslots: int, slot_bytes: int | None,
                    link_gbps: float | None, node_size: int | None,
                    inter_node_gbps: float | None) -> Any:
    """The world's shared-memory segment: N^2 channels of ``nslots`` slots (1 MiB up to 8
    ranks, 256 KiB beyond), with the emulated link and topology in its header."""
    if slot_bytes is None:
        slot_bytes = 1 << 20 if world_size <= 8 else 1 << 18
    node, inter = topology(world_size, node_size, inter_node_gbps)
    return shm.create(world_size, nslots, slot_bytes, link_bytes_per_s(link_gbps), node, inter)


class World:
    """``world_size`` processes with the process group initialised, kept alive."""

    def __init__(self, world_size: int, *, timeout: float = 60.0, nslots: int = 4,
                 slot_bytes: int | None = None, check: bool = True, init_group: bool = True,
                 run_timeout: float | None = None, start_timeout: float = 120.0,
                 link_gbps: float | None = None, node_size: int | None = None,
                 inter_node_gbps: float | None = None, env: dict | None = None,
                 output: RankOutput | None = None, fault_tolerant: bool = False,
                 replacements: int = 0):
        """``timeout``: seconds a send or receive may wait without progress;
        ``nslots`` x ``slot_bytes``: the ring of each pair's channel (1 MiB slots
        up to 8 ranks, 256 KiB beyond, as there are N^2 channels); ``check``:
        verify that ranks make the same collective calls; ``init_group``: call
        init_process_group in each rank (``minidist run`` leaves it to the
        script); ``run_timeout``: limit on one ``run`` (None: none);
        ``link_gbps``: emulate a link of that many GB/s between every pair of
        ranks (transport/link.py; None: ``MINIDIST_LINK_GBPS`` if set, else none);
        ``node_size``, ``inter_node_gbps``: a two-level topology, ranks grouped
        in nodes of ``node_size`` with links of ``inter_node_gbps`` between
        nodes (link.py; None: ``MINIDIST_NODE_SIZE`` / ``MINIDIST_INTER_NODE_GBPS``);
        ``env``: variables added to each rank's environment; ``output``: collect
        the ranks' output, prefixed, into the console and log files (output.py;
        None: the ranks write to this process's stdout and stderr directly);
        ``fault_tolerant``: a rank that dies lets the others go on; ``replacements``:
        how many dead ranks it may start again, in a fault-tolerant world (module
        docstring)."""
        check_can_start(world_size)
        self.world_size = world_size
        # Under MINIDIST_TRACE, which world of the run this is (trace/session.py);
        # first, so that the trace is merged after this world has closed at exit
        env = dict(world_env(), **(env or {}))
        self.run_timeout = run_timeout  # limit on one run() (None: rely on comm timeouts)
        self.closed, self.fault_tolerant, self.noticed = False, fault_tolerant, {}
        self.lost: dict[int, RankLost] = {}   # rank -> how it died (fault_tolerant)
        self.replacements = Respawner(replacements if fault_tolerant else 0)
        self._message, self._output = b"", output   # the run in progress (for a replacement)
        self._segment = _create_segment(world_size, nslots, slot_bytes, link_gbps, node_size,
                                        inter_node_gbps)
        self.segment_name = self._segment.name
        atexit.register(self.close)
        # The ranks use this process's backend, also when it was chosen with
        # set_backend() rather than MINIDIST_BACKEND (which they would inherit).
        self._options = options = dict(timeout=timeout, check=check, init_group=init_group,
                                       backend=backend.get_backend(), env=env)
        self._conns, self._procs = [], []
        try:
            with threads_per_rank(world_size):
                self._start(world_size, options)
            self._collect(start_timeout, "starting")
        except BaseException:
            self.close(force=True)
            raise

    def _start(self, world_size: int, options: dict) -> None:
        for rank in range(world_size):
            streams = self._output.child_ends(rank) if self._output is not None else None
            conn, p = self._spawn(rank, options, streams)
            self._conns.append(conn)
            self._procs.append(p)
        if self._output is not None:
            self._output.start()

    def _spawn(self, rank: int, options: dict, streams) -> tuple:
        ctx = multiprocess.get_context("spawn")
        parent_end, child_end = ctx.Pipe()
        p = ctx.Process(target=rank_main, name=f"minidist-rank{rank}", daemon=True,
                        args=(rank, self.world_size, self.segment_name, child_end, options,
                              streams))
        p.start()
        child_end.close()
        return parent_end, p

    @property
    def replaced(self) -> list[RankLost]:
        """The deaths a new process took over (replacement.py)."""
        return self.replacements.done

    def _respawn(self, r: int, options: dict) -> None:
        """A new process for rank r, sent the run in progress; the old one's group is
        ended at close."""
        streams = self._output.more_ends(r) if self._output is not None else None
        with threads_per_rank(self.world_size):
            conn, p = self._spawn(r, options, streams)
        if self._output is not None:
            self._output.start_more(r)
        self.replacements.gone.append(self._procs[r])
        self._conns[r].close()
        self._conns[r], self._procs[r] = conn, p
        conn.send_bytes(self._message)

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank; return the per-rank results."""
        if self.closed:
            raise RuntimeError("this world is closed (a rank failed, or close() was called)")
        if self.lost:
            raise RuntimeError(f"this world lost ranks {sorted(self.lost)} in an earlier run; "
                               "start a new one")
        message = self._message = payload.dumps((fn, args, kwargs))
        try:
            for conn in self._conns:
                conn.send_bytes(message)
            return self._collect(self.run_timeout, getattr(fn, "__name__", "fn"))
        except BaseException:
            self.close(force=True)
            raise

    def _collect(self, timeout: float | None, what: str) -> list:
        """Wait for one reply per rank; on any failure, stop the world and raise."""
        n = self.world_size
        results: list = [None] * n
        failures: dict[int, tuple[str, str, bool]] = {}  # rank -> (type, traceback, aborted)
        pending = set(range(n))
        start = time.monotonic()
        failed_at = None
        during = " while starting" if what == "starting" else ""
        while pending:
            limit = None if timeout is None else start + timeout - time.monotonic()
            if failed_at is not None:
                grace = failed_at + GRACE_S - time.monotonic()
                limit = grace if limit is None else min(limit, grace)
            if limit is not None and limit <= 0:
                break
            waiting = self.replacements.waiting
            if waiting:
                self.replacements.start_due(self, pending, results)
                limit = REPLACE_POLL_S if limit is None else min(limit, REPLACE_POLL_S)
            running = [r for r in pending if r not in waiting]
            ready = wait_any([self._conns[r] for r in running] +
                             [self._procs[r].sentinel for r in running], limit)
            for r in running:
                conn, proc = self._conns[r], self._procs[r]
                if conn not in ready and proc.sentinel not in ready:
                    continue
                self._take_reply(r, results, failures, during)
                if r not in waiting:
                    pending.discard(r)
            if failures and failed_at is None:
                failed_at = time.monotonic()
                shm.set_abort(self._segment, -1, f"rank {min(failures)} failed")
        if pending and not failures:  # the time limit: no rank failed, none is blamed
            records = shm.flight_records(self._segment)
            report = "\n".join(flight.who_is_missing(records) + [flight.table(records)])
            self.close(force=True)
            raise WorldTimeoutError(what, timeout, sorted(pending), report)
        if len(self.lost) == n:   # every rank died: nobody went on
            failures = {r: ("ProcessExited", f"{lost}\n", False) for r, lost in self.lost.items()}
        for r in pending:  # still running when the others failed: stopped with them
            failures[r] = ("Stopped", f"rank {r} was still running and was stopped\n", True)
        if failures:
            self.close(force=True)
            first = min((r for r in failures if not failures[r][2]), default=min(failures))
            raise RankFailedError(first, failures[first][0], failures[first][1],
                                  {r: f[:2] for r, f in sorted(failures.items())})
        return results

    def _take_reply(self, r: int, results: list, failures: dict, during: str) -> None:
        """Rank r's result into ``results``, or its failure into ``failures``; in a
        fault-tolerant world a rank that died is marked dead for the others instead."""
        reply = self._reply(r, during)
        if reply[0] == "ok":
            results[r] = reply[1]
        elif reply[1] == "ProcessExited" and self.fault_tolerant and not during:
            code = self._procs[r].exitcode
            lost = RankLost(r, -1 if code is None else code)
            shm.mark_died(self._segment, r, lost.exit_code)
            if not self.replacements.wait_for(lost, shm.deaths(self._segment)):
                results[r] = self.lost[r] = lost
        else:
            failures[r] = reply[1:]

    def _reply(self, r: int, during: str) -> tuple:
        """Rank r's ("ok", result) or ("failed", type, traceback, aborted), a silent exit too."""
        try:
            reply = self._conns[r].recv() if self._conns[r].poll() else None
        except (EOFError, OSError):
            reply = None
        if reply is None:
            self.noticed[r] = time.monotonic()   # the OS has said so (its sentinel)
            self._procs[r].join(0.5)
            return ("failed", "ProcessExited", f"rank {r} exited with code "
                    f"{exit_code_text(self._procs[r].exitcode)}{during}\n", False)
        return reply if reply[0] == "ok" else ("failed", *reply[1:4])

    def close(self, force: bool = False) -> None:
        """Stop every rank and remove the segment. Ranks are asked to exit and
        given 2 s, then terminated; with ``force`` (after a failure) at once."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        if not force:
            for conn in self._conns:
                try:
                    conn.send_bytes(b"")  # "exit" to a rank waiting for work
                except (OSError, ValueError):
                    pass
            deadline = time.monotonic() + 2.0
            for p in self._procs:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for conn in self._conns:
            conn.close()
        if self._output is not None:
            self._output.close()
        for p in self._procs + self.replacements.gone:
            end_process_group(p.pid)       # what the rank started, still running
        name = self.segment_name
        shm.close(self._segment)
        shm.unlink(name)


def launch(fn: Callable, world_size: int, *args: Any, **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` new processes, each with the
    process group initialised, and return the list of their return values.

    Like ``torch.multiprocessing.spawn``, but returning results. Call it under
    ``if __name__ == "__main__":`` in a script: spawned processes import it.
    Raises ``RankFailedError`` (rank, remote traceback) if any rank fails.
    """
    with World(world_size) as world:
        return world.run(fn, *args, **kwargs)
