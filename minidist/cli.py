"""The ``minidist`` command line.

    minidist run -n 4 script.py [args...]    # like torchrun: 4 local processes

``run`` starts N processes (spawned, sharing one shared-memory segment); each
runs ``script.py`` as ``__main__`` with RANK, WORLD_SIZE, LOCAL_RANK and
LOCAL_WORLD_SIZE in its environment, and the script calls
``minidist.distributed.init_process_group()``. If any rank fails, the others
are stopped, its traceback is printed, and the command exits with status 1
(130 on Ctrl-C). Under ``mpiexec`` run the script directly instead:
``mpiexec -n 4 python script.py``.

Other subcommands register themselves in ``SUBCOMMANDS``: a function that adds
its arguments to a subparser and returns the function that runs it.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import Callable


def _run_script(path: str, argv: list[str]) -> None:
    """Executed on every rank: run the user's script as __main__."""
    sys.argv = [path] + list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        from minidist.comm import group
        group.destroy_process_group()


def _add_run(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("-n", "--nproc", type=int, default=2, help="number of processes")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a run may take in all before it is stopped")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")

    def run(ns: argparse.Namespace) -> int:
        from minidist.comm import World
        from minidist.comm.errors import RankFailedError
        if not os.path.exists(ns.script):
            print(f"minidist run: no such script: {ns.script}", file=sys.stderr)
            return 2
        try:
            with World(ns.nproc, init_group=False, run_timeout=ns.timeout) as world:
                world.run(_run_script, ns.script, ns.args)
        except RankFailedError as e:
            print(f"minidist run: rank {e.rank} failed ({e.exc_type}):\n{e.remote_traceback}",
                  file=sys.stderr, end="")
            others = [r for r in e.failures if r != e.rank]
            if others:
                print(f"minidist run: ranks {others} were stopped", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("minidist run: interrupted, every rank stopped", file=sys.stderr)
            return 130
        return 0
    return run


# name -> (help, function adding the subcommand's arguments and returning its runner)
SUBCOMMANDS: dict[str, tuple[str, Callable]] = {
    "run": ("run a script on N local processes (like torchrun)", _add_run),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minidist", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_text, add) in SUBCOMMANDS.items():
        runners[name] = add(sub.add_parser(name, help=help_text))
    ns = parser.parse_args(argv)
    return runners[ns.command](ns)


if __name__ == "__main__":
    sys.exit(main())
