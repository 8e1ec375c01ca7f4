"""The ``minidist`` command line.

    minidist run -n 4 script.py [args...]    # like torchrun: 4 local processes
    minidist demo [NAME] [args...]           # list the numbered demos, or run one
    minidist bench [NAME] [args...]          # list the benchmarks, or run one
    minidist calc TOPIC --flags              # the cost models (see `minidist calc --help`)
    minidist plan --model llama3-8b --gpus 64   # the best parallel layouts, explained
    minidist selftest [--backend cupy]       # this backend against NumPy, and the test suite
    minidist exercise list|start|check [ID]  # the documents' exercises, graded by property tests
    minidist checkpoint convert OLD NEW --trust-pickle   # an old pickled checkpoint -> data-only
    minidist trace summary|plot run.json     # a run's trace (minidist run --trace run.json)

``run`` starts N processes like torchrun (its flags: --nproc-per-node,
--max-restarts, --log-dir, --redirects, --tee); minidist/comm/launch/script.py
says how, and what its exit status means. Under ``mpiexec`` run the script
directly instead: ``mpiexec -n 4 python script.py``.

Other subcommands register themselves in ``SUBCOMMANDS``: a function that adds
its arguments to a subparser and returns the function that runs it.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Callable


def _add_run(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.comm.launch.script import add_arguments
    return add_arguments(parser)


REPO = pathlib.Path(__file__).resolve().parents[1]


def _scripts(folder: str, pattern: str) -> dict[str, pathlib.Path]:
    where = REPO / folder
    if not where.is_dir():
        raise SystemExit(f"minidist: no {folder}/ folder next to the package ({where}); "
                         "the demos and benchmarks come with a source checkout")
    return {p.stem: p for p in sorted(where.glob(pattern))}


def _summary(path: pathlib.Path) -> str:
    """The first paragraph of a script's docstring, as one line, without running it."""
    text = path.read_text()
    for quote in ('"""', "'''"):
        if quote in text:
            return " ".join(text.split(quote, 2)[1].strip().split("\n\n")[0].split())
    return ""


def _listing(stem: str, summary: str) -> list[str]:
    """One script of a listing: its name, then its summary wrapped at spaces to 100 columns."""
    return textwrap.wrap(f"  {stem:<28} {summary}", 100, subsequent_indent=" " * 31,
                         break_long_words=False, break_on_hyphens=False)


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
                    print("\n".join(_listing(stem, _summary(path))))
                first = next(iter(scripts), None)
                if first is not None:
                    print(_run_line(ns.command, first, folder))
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


def _run_line(command: str, stem: str, folder: str) -> str:
    """What to type next, under a listing: run one, and see its options."""
    short = stem.split("_")[0] if command == "demo" else stem.removeprefix("bench_")
    return (f"\nrun one: minidist {command} {short}  (or python {folder}/{stem}.py)\n"
            f"its options: minidist {command} {short} --help")


def _add_calc(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.calc.commands import add_calc_parser
    return add_calc_parser(parser)


def _add_plan(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.calc.planner.command import add_arguments

    def runner():       # plan --measure runs layouts with the strategies (calc cannot)
        from minidist.parallel.compare import measure
        return measure
    return add_arguments(parser, runner)


def _add_exercise(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.exercises.command import add_arguments
    return add_arguments(parser)


def _add_checkpoint(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.checkpoint.convert import add_arguments
    return add_arguments(parser)


def _add_compare(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.parallel.compare.command import add_arguments
    return add_arguments(parser)


def _add_selftest(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.selftest.command import add_arguments
    return add_arguments(parser)


def _add_trace(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    from minidist.trace.command import add_arguments
    return add_arguments(parser)


# name -> (help, function adding the subcommand's arguments and returning its runner)
SUBCOMMANDS: dict[str, tuple[str, Callable]] = {
    "run": ("run a script on N local processes (like torchrun)", _add_run),
    "demo": ("list the numbered demos, or run one", _add_script_runner("demos", "[0-9]*.py", "demo")),
    "bench": ("list the benchmarks, or run one", _add_script_runner("bench", "bench_*.py", "benchmark")),
    "calc": ("closed-form cost models: memory, communication, bubbles, FLOPs", _add_calc),
    "plan": ("which parallel layout for this model on these GPUs: memory and step time "
             "of every one", _add_plan),
    "compare": ("train one model under two layouts; per step both losses in ulps, and where "
                "they part", _add_compare),
    "selftest": ("this backend against NumPy: the comparison checks and the property suite",
                 _add_selftest),
    "exercise": ("the documents' exercises: list, start one, check it", _add_exercise),
    "checkpoint": ("convert an old (pickled) checkpoint to the data-only format",
                   _add_checkpoint),
    "trace": ("read a run's trace (minidist run --trace run.json): summary, plot, merge, check",
              _add_trace),
}


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)subcommand's parser puts itself in the namespace as ``usage_of``: the
    innermost one that parsed is the one whose usage an unknown argument shows. argparse
    itself reports those with the top-level usage."""
    parser.set_defaults(usage_of=parser)
    for action in parser._actions:   # argparse keeps its subparsers in no public place
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _remember_parsers(child)


DESCRIPTION = "Distributed training from scratch on NumPy: run scripts, demos, benchmarks and cost models."
EXAMPLES = """examples:
  minidist run -n 4 demos/02_collectives.py    run a script on 4 processes, like torchrun
  minidist demo                                list the demos; minidist demo 04 runs one
  minidist calc zero --params 7e9 --gpus 8     memory per GPU of ZeRO stages
  minidist <command> --help                    the options of one command"""


def main(argv: list[str] | None = None) -> int:
    from minidist import __version__, trace
    trace.session.discard_script_recording()   # `run --trace` traces the ranks; others need none
    parser = argparse.ArgumentParser(prog="minidist", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"minidist {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_text, add) in SUBCOMMANDS.items():
        runners[name] = add(sub.add_parser(name, help=help_text,
                                           description=help_text[0].upper() + help_text[1:] + "."))
    _remember_parsers(parser)
    ns, unknown = parser.parse_known_args(argv)
    if unknown:     # `calc llama --bogus`: the usage of `calc llama`, not of `minidist`
        ns.usage_of.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return runners[ns.command](ns)
    except BrokenPipeError:  # `minidist demo | head`: the reader left early, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
