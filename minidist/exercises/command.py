"""``minidist exercise``: list the exercises, start one, check it.

    minidist exercise list                      # every exercise, and your progress
    minidist exercise start 35.2                # writes ./minidist-exercises/ex_35_2_...py
    minidist exercise check 35.2                # grades it: each property, PASS or FAIL
    minidist exercise check 1.2 --answer 29.3   # a derive exercise: your number

``--dir`` chooses the workspace (default ``./minidist-exercises``). ``check``
exits 0 only when every property holds (a derive answer: when it is right to
the document's precision), 1 otherwise, 2 for a usage error.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Callable

from minidist.exercises import workspace
from minidist.exercises.core import Subject


def add_arguments(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("action", choices=("list", "start", "check"),
                        help="list the exercises, start one in the workspace, or check it")
    parser.add_argument("id", nargs="?", help="the exercise number, as the documents give it "
                        "(35.2, 26.10, 0.5 ...)")
    parser.add_argument("--dir", default=workspace.DEFAULT_DIR,
                        help="the workspace folder (default: ./minidist-exercises)")
    parser.add_argument("--answer", type=float, default=None,
                        help="your number, for a derive exercise (in the unit it states)")
    parser.add_argument("--force", action="store_true",
                        help="start: overwrite the file if it exists (your edits are lost)")
    parser.add_argument("--examples", type=int, default=None,
                        help="check: hypothesis examples per property (default: each "
                             "property's own, 10-25)")
    return run


def run(ns: argparse.Namespace) -> int:
    from minidist.exercises import DERIVE, EXERCISES, find
    where = pathlib.Path(ns.dir)
    if ns.action == "list":
        _list(EXERCISES, DERIVE, where)
        return 0
    if ns.id is None:
        print(f"minidist exercise {ns.action}: which exercise? e.g. `minidist exercise "
              f"{ns.action} 35.2` (`minidist exercise list` lists them)", file=sys.stderr)
        return 2
    exercise = find(ns.id)
    if exercise is None:
        print(f"minidist exercise: no exercise {ns.id!r}; `minidist exercise list` lists them",
              file=sys.stderr)
        return 2
    if exercise.kind == "derive":
        return _derive(exercise, ns, where)
    if ns.action == "start":
        path, written = workspace.write_starter(where, exercise.filename, exercise.starter,
                                                ns.force)
        if written:
            print(f"wrote {path}\nedit it, then: minidist exercise check {exercise.id}"
                  + (f" --dir {ns.dir}" if ns.dir != workspace.DEFAULT_DIR else ""))
        else:
            print(f"{path} exists (kept); --force starts over")
        return 0
    path = workspace.file_of(where, exercise.filename)
    if not path.exists():
        print(f"minidist exercise check: {path} does not exist; start with "
              f"`minidist exercise start {exercise.id}`", file=sys.stderr)
        return 2
    from minidist.exercises.grading import check, report
    results = check(exercise, Subject(path), ns.examples)
    print(report(exercise, results))
    passed = all(r.passed for r in results)
    workspace.record(where, exercise.id, passed)
    return 0 if passed else 1


def _derive(exercise, ns: argparse.Namespace, where: pathlib.Path) -> int:
    if ns.action == "start":
        print(exercise.prompt())
        print(f"\nanswer with: minidist exercise check {exercise.id} --answer NUMBER")
        return 0
    if ns.answer is None:
        print(f"minidist exercise check {exercise.id}: a derive exercise takes your number: "
              f"--answer NUMBER (in {exercise.unit})", file=sys.stderr)
        return 2
    right, message = exercise.grade(ns.answer)
    print(message)
    where.mkdir(parents=True, exist_ok=True)
    workspace.record(where, exercise.id, right)
    return 0 if right else 1


def _list(exercises, derives, where: pathlib.Path) -> None:
    done = workspace.progress(where)
    print(f"{'id':<6} {'kind':<10} {'state':<8} title")
    for ex in list(exercises) + list(derives):
        if ex.id in done:
            state = done[ex.id]
        elif ex.kind != "derive" and workspace.file_of(where, ex.filename).exists():
            state = "started"
        else:
            state = "-"
        print(f"{ex.id:<6} {ex.kind:<10} {state:<8} {ex.title}")
    print(f"\nworkspace: {where}/   start one: minidist exercise start ID   "
          "course order: docs/exercises.md")
