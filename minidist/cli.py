"""The ``minidist`` command line.

    minidist run -n 4 script.py [args...]    # like torchrun: 4 local processes
    minidist demo [NAME] [args...]           # list the numbered demos, or run one
    minidist bench [NAME] [args...]          # list the benchmarks, or run one
    minidist calc TOPIC --flags              # the cost models (see `minidist calc --help`)
    minidist selftest [--backend cupy]       # this backend against NumPy, and the test suite
    minidist exercise list|start|check [ID]  # the documents' exercises, graded by property tests

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
import pathlib
import runpy
import subprocess
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


REPO = pathlib.Path(__file__).resolve().parents[1]


def _scripts(folder: str, pattern: str) -> dict[str, pathlib.Path]:
    where = REPO / folder
    if not where.is_dir():
        raise SystemExit(f"minidist: no {folder}/ folder next to the package ({where}); "
                         "the demos and benchmarks come with a source checkout")
    return {p.stem: p for p in sorted(where.glob(pattern))}


def _first_doc_line(path: pathlib.Path) -> str:
    """The first line of a script's docstring, without parsing or running it."""
    text = path.read_text()
    for quote in ('"""', "'''"):
        if quote in text:
            return text.split(quote, 2)[1].strip().split("\n")[0]
    return ""


def _add_script_runner(folder: str, pattern: str, what: str):
    """`minidist demo` / `minidist bench`: list the scripts, or run the one named."""
    def add(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
        parser.add_argument("name", nargs="?", help=f"{what} to run: its number or any "
                            "unique part of its name (omit to list them)")
        parser.add_argument("args", nargs=argparse.REMAINDER, help=f"arguments of the {what}")

        def run(ns: argparse.Namespace) -> int:
            scripts = _scripts(folder, pattern)
            if ns.name is None:
                for stem, path in scripts.items():
                    print(f"  {stem:<28} {_first_doc_line(path)}")
                return 0
            matches = [p for stem, p in scripts.items()
                       if stem == ns.name or stem.startswith(ns.name + "_") or ns.name in stem]
            if len(matches) != 1:
                names = ", ".join(p.stem for p in matches) or "none"
                print(f"minidist: {ns.name!r} matches {names}; `minidist {ns.command}` lists them",
                      file=sys.stderr)
                return 2
            return subprocess.call([sys.executable, str(matches[0]), *ns.args])
        return run
    return add


def _add_calc(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.calc.commands import add_calc_parser
    return add_calc_parser(parser)


def _add_exercise(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.exercises.command import add_arguments
    return add_arguments(parser)


def _add_selftest(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.selftest.command import add_arguments
    return add_arguments(parser)


# name -> (help, function adding the subcommand's arguments and returning its runner)
SUBCOMMANDS: dict[str, tuple[str, Callable]] = {
    "run": ("run a script on N local processes (like torchrun)", _add_run),
    "demo": ("list the numbered demos, or run one", _add_script_runner("demos", "[0-9]*.py", "demo")),
    "bench": ("list the benchmarks, or run one", _add_script_runner("bench", "bench_*.py", "benchmark")),
    "calc": ("closed-form cost models: memory, communication, bubbles, FLOPs", _add_calc),
    "selftest": ("this backend against NumPy: the comparison checks and the property suite",
                 _add_selftest),
    "exercise": ("the documents' exercises: list, start one, check it", _add_exercise),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minidist", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_text, add) in SUBCOMMANDS.items():
        runners[name] = add(sub.add_parser(name, help=help_text))
    ns = parser.parse_args(argv)
    try:
        return runners[ns.command](ns)
    except BrokenPipeError:  # `minidist demo | head`: the reader left early, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
