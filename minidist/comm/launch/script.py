"""``minidist run``: a script on N local processes, with torchrun's flags and restarts.

    minidist run --nproc-per-node 4 --max-restarts 2 --log-dir logs train.py --lr 3e-4

Each attempt is a fresh ``World`` (world.py) whose ranks run the script as
``__main__`` with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
``MINIDIST_RESTART_COUNT`` (torchrun: ``TORCHELASTIC_RESTART_COUNT``) in their
environment. Their output comes back line by line with a ``[rank N]`` prefix,
and into ``--log-dir`` (output.py).

Elastic restart: when a rank fails and restarts are left, every rank is
stopped and the whole world is started again, attempt K+1 with
``MINIDIST_RESTART_COUNT=K+1``. Nothing is carried over but the files the
script wrote, so a script that saves checkpoints resumes from its last one::

    start = 0
    if os.path.exists(CKPT):                       # a restart: pick up where we were
        start = load_checkpoint(CKPT, model, opt)["step"] + 1

With ``--fault-tolerant`` a rank that dies lets the others go on (parallel/
fault_tolerance/), and while restarts are left each dead rank is started again on its
own, as the same rank, in the world that goes on (world.py, ``replacements``): its
script runs from the start with ``MINIDIST_REPLACEMENT`` set and heals from a live
peer at the next quorum, not from a checkpoint. The whole world is restarted only
when the quorum is lost.

Exit status, as torchrun's: 0 when an attempt finishes; 1 when a rank failed
and no restart is left (the first line names the first failing rank and the
ranks that failed too or were stopped; then its traceback, once, ending with
the message: for minidist's own errors only the script's frames, all of them
with ``--verbose``, report.py); 124 when ``--timeout`` stopped the world (no
rank is blamed: the message lists the ranks still running and each one's last
communication call); 130 on Ctrl-C; 2 for a usage error.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from typing import Callable

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 2, 124, 130


def run_script(path: str, argv: list[str]) -> None:
    """Executed on every rank: run the user's script as __main__."""
    sys.argv = [path] + list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except BaseException as e:
        from minidist.trace import recorder as trace
        if trace.active is not None:   # the failure, where it happened, in the trace
            trace.active.instant(f"{type(e).__name__}: {e}"[:200], "failure", scope="p")
        raise
    finally:
        from minidist.comm import group
        group.destroy_process_group()


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _streams(text: str) -> int:
    if text not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(
            f"expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The arguments of ``minidist run``; returns the function that runs it."""
    parser.add_argument("-n", "--nproc-per-node", "--nproc", dest="nproc", type=_count(1),
                        default=2, metavar="N", help="number of processes (default 2)")
    parser.add_argument("--max-restarts", type=_count(0), default=0, metavar="K",
                        help="start every rank again after a failure, up to K times "
                             "(the script sees MINIDIST_RESTART_COUNT; default 0)")
    parser.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="stop an attempt that runs longer, and say what every rank "
                             "was doing (default: no limit)")
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="write each rank's output to DIR/attempt_K/rank_N/stdout.log "
                             "and stderr.log (as well as the console, unless --redirects)")
    parser.add_argument("--redirects", type=_streams, default=0, metavar="{0,1,2,3}",
                        help="streams that go to the log files only: 1 stdout, 2 stderr, "
                             "3 both (needs --log-dir)")
    parser.add_argument("--tee", type=_streams, default=None, metavar="{0,1,2,3}",
                        help="streams that go to the log files and the console "
                             "(default with --log-dir: 3, both)")
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="a rank that dies (killed) lets the others go on: their waits "
                             "on it fail at once, for a quorum of replicas to carry on "
                             "(parallel/fault_tolerance; a rank that raises still fails)")
    parser.add_argument("--verbose", action="store_true",
                        help="report a failing rank's whole traceback, minidist's own "
                             "frames included (as MINIDIST_VERBOSE=1 does)")
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="record a trace of every rank into FILE (run.json, or run.json.gz "
                             "gzipped) for ui.perfetto.dev; `minidist trace summary FILE` reads it")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")

    def run(ns: argparse.Namespace) -> int:
        if not os.path.isfile(ns.script):
            parser.error(f"no such script: {ns.script}")
        if ns.log_dir is None and (ns.redirects or ns.tee):
            parser.error("--redirects and --tee write log files: give --log-dir too")
        tee = ns.tee if ns.tee is not None else (3 if ns.log_dir else 0)
        return run_elastic(ns.script, ns.args, ns.nproc, max_restarts=ns.max_restarts,
                           timeout=ns.timeout, log_dir=ns.log_dir, redirects=ns.redirects,
                           tee=tee & ~ns.redirects, verbose=ns.verbose, trace=ns.trace,
                           fault_tolerant=ns.fault_tolerant)
    return run


def run_elastic(script: str, args: list[str], nproc: int, max_restarts: int = 0,
                timeout: float | None = None, log_dir: str | None = None, redirects: int = 0,
                tee: int = 0, verbose: bool = False, trace: str | None = None,
                fault_tolerant: bool = False) -> int:
    """Run ``script`` on ``nproc`` ranks, restarting the world after a failure up to
    ``max_restarts`` times; returns the exit status (module docstring). ``trace``:
    merge the ranks' traces of every attempt into that file, failures included."""
    failures: list = []
    if trace is not None:
        from minidist.trace.merge import remove_parts
        remove_parts(trace)   # left by an earlier run that was killed
    try:
        return _run_attempts(script, args, nproc, max_restarts, timeout, log_dir, redirects,
                             tee, verbose, trace, failures, fault_tolerant)
    finally:
        if trace is not None:
            _merge_trace(trace, failures)


def _run_attempts(script: str, args: list[str], nproc: int, max_restarts: int,
                  timeout: float | None, log_dir: str | None, redirects: int, tee: int,
                  verbose: bool, trace: str | None, failures: list,
                  fault_tolerant: bool = False) -> int:
    from minidist.comm.errors import RankFailedError, WorldTimeoutError
    from minidist.comm.launch.output import RankOutput
    from minidist.comm.launch.world import World
    name = os.path.basename(script)
    replaced = 0          # restarts spent on replacement processes (--fault-tolerant)
    for attempt in range(max_restarts + 1):
        if attempt + replaced > max_restarts:
            break
        env = _attempt_env(attempt, max_restarts, verbose, trace)
        output = RankOutput(nproc, log_dir, attempt, redirects, tee)
        try:
            world = None
            with World(nproc, init_group=False, run_timeout=timeout, env=env,
                       output=output, fault_tolerant=fault_tolerant,
                       replacements=max_restarts - attempt - replaced) as world:
                world.run(run_script, script, args)
            _say_replaced(world)
            for lost in world.lost.values():
                _say(f"{lost}; the others went on without it (--fault-tolerant)")
            return 0
        except RankFailedError as e:
            if world is not None:
                replaced += len(world.replaced)
                _say_replaced(world)
            failures.append(dict(rank=e.rank, at=time.perf_counter(), attempt=attempt,
                                 message=f"{e.exc_type}\n{e.remote_traceback}"))
            _say(f"{_who_failed(e)}:\n{e.remote_traceback}", end="")  # ends with the message
            if attempt + replaced >= max_restarts:
                if max_restarts:
                    _say(f"{name} failed in each of its {max_restarts + 1} attempts")
                return EXIT_FAILED
            _say(f"restarting every rank (restart {attempt + 1} of {max_restarts})")
        except WorldTimeoutError as e:
            failures += [dict(rank=r, at=time.perf_counter(), attempt=attempt,
                              message=f"stopped after --timeout {e.timeout:g} s\n{e.report}")
                         for r in e.running]
            _say(f"{name} did not finish within {e.timeout:g} s; no rank failed. Ranks "
                 f"{e.running} were still running and were stopped.\n{e.report}")
            return EXIT_TIMEOUT
        except KeyboardInterrupt:
            _say("interrupted, every rank stopped")
            return EXIT_INTERRUPTED
    return EXIT_FAILED


def _attempt_env(attempt: int, max_restarts: int, verbose: bool, trace: str | None) -> dict:
    """The variables every rank of this attempt starts with."""
    env = dict(MINIDIST_RESTART_COUNT=str(attempt), MINIDIST_MAX_RESTARTS=str(max_restarts))
    if verbose:
        env["MINIDIST_VERBOSE"] = "1"    # read where the traceback is written (report.py)
    if trace is not None:   # every rank records; this process merges (trace/session.py)
        env.update(MINIDIST_TRACE=trace, MINIDIST_TRACE_MERGE="parent")
    return env


def _say_replaced(world) -> None:
    for lost in world.replaced:
        _say(f"{lost}; a new process took it over and healed from a peer "
             "(--fault-tolerant --max-restarts)")


def _merge_trace(path: str, failures: list) -> None:
    """One trace file from the ranks' parts, with the failures as instant events."""
    from minidist.trace.merge import merge, parts_of
    if not parts_of(path):
        _say(f"no trace was recorded into {path} (did the script call init_process_group?)")
        return
    merge(path, failures)
    _say(f"trace of every rank in {path}: `minidist trace summary {path}`, or open it "
         "in ui.perfetto.dev")


def _who_failed(e) -> str:
    """"rank 0 failed (CollectiveMismatchError); rank 1 failed too; ranks [2, 3] were
    stopped": the first line of a failure, so that the report ends with the message."""
    line = f"rank {e.rank} failed ({e.exc_type})"
    stopped = [r for r, (kind, _) in e.failures.items()
               if r != e.rank and kind in ("Stopped", "WorldAbortedError")]
    failed = [r for r in e.failures if r != e.rank and r not in stopped]
    if len(failed) == 1:
        line += f"; rank {failed[0]} failed too"
    elif failed:
        line += f"; ranks {failed} failed too"
    if stopped:
        line += f"; ranks {stopped} were stopped"
    return line


def _say(message: str, end: str = "\n") -> None:
    print(f"minidist run: {message}", file=sys.stderr, end=end, flush=True)
