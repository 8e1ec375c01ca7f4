"""``minidist selftest``: the property suite and the comparison suite, on one backend.

    minidist selftest --backend cupy             # on a GPU: everything, cupy against numpy
    minidist selftest --backend guard --quick    # the CuPy-like guard, small and fast
    minidist selftest -k "round or flash"        # only what matches (as pytest's -k)
    minidist selftest --backend cupy --jobs 8    # the property suite in 8 pytest-xdist workers

1. The comparison suite (checks.py): every check computes the same thing on the
   chosen backend and on NumPy from the same host inputs, and compares them
   bit for bit (rounding, data movement) or by the flash-attention rule
   (matmul-based results). One line per check; any FAIL makes the exit status 1.
2. The property suite: ``python -m pytest tests/`` of the source checkout with
   ``MINIDIST_BACKEND`` set to the chosen backend, in a subprocess. With
   ``--quick``, only its single-process part (backend, autograd, nn, optim,
   precision, attention: about 30 s on 2 cores). Without a checkout next to the
   package (an installed wheel) there is no tests/ folder: the command says so and
   runs the comparison suite alone. ``--jobs N`` spreads it over N pytest-xdist
   workers (each its own process, so on CuPy each its own CUDA context).

Exit status: 0 if everything passed, 1 if anything failed, 2 if the backend
cannot run here (no CuPy or no CUDA device for ``cupy``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from typing import Callable

from minidist import backend
from minidist.selftest.checks import CHECKS
from minidist.selftest.compare import Check, Result, active_backend, run_check

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
QUICK_TESTS = ["test_backend.py", "autograd", "nn", "optim", "precision", "attention"]


def add_arguments(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--backend", choices=backend.BACKENDS,
                        default=os.environ.get("MINIDIST_BACKEND", "numpy"),
                        help="the backend to test against NumPy (default: MINIDIST_BACKEND, "
                             "else numpy)")
    parser.add_argument("-k", dest="expr", default=None,
                        help="only checks and tests matching this expression "
                             "(words, and / or / not, parentheses: as pytest's -k)")
    parser.add_argument("--quick", action="store_true",
                        help="small comparison sizes and only the single-process tests")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run the property suite in N pytest-xdist workers (needs "
                             "pytest-xdist; default 1: one process)")
    return run


def run(ns: argparse.Namespace) -> int:
    problem = _unavailable(ns.backend)
    if problem:
        print(f"minidist selftest: backend {ns.backend} cannot run here: {problem}",
              file=sys.stderr)
        return 2
    try:
        checks = select(CHECKS, ns.expr)
    except SyntaxError:
        print(f"minidist selftest: cannot read -k {ns.expr!r}", file=sys.stderr)
        return 2
    with active_backend(ns.backend):
        where = f"{ns.backend} on {backend.device_name()}"
    print(f"minidist selftest: {where}")
    if ns.jobs < 1:
        print(f"minidist selftest: --jobs must be at least 1, not {ns.jobs}", file=sys.stderr)
        return 2
    if ns.jobs > 1 and importlib.util.find_spec("xdist") is None:
        print("minidist selftest: --jobs needs pytest-xdist (pip install pytest-xdist)",
              file=sys.stderr)
        return 2
    failed = run_checks(checks, ns.backend, ns.quick)
    tests_ok = run_property_suite(ns.backend, ns.expr, ns.quick, ns.jobs)
    suite = {True: "passed", False: "failed", None: "not run"}[tests_ok]
    verdict = "FAILED" if failed or tests_ok is False else "passed"
    print(f"minidist selftest, {where}: {verdict} ({failed} of {len(checks)} "
          f"comparison checks failed; property suite {suite})")
    return 1 if verdict == "FAILED" else 0


def run_checks(checks: list[Check], backend_name: str, quick: bool) -> int:
    """Run and print each check (one line each); return how many failed."""
    size = "small" if quick else "full"
    print(f"comparison suite: {backend_name} against numpy, same host inputs, {size} sizes")
    failed = 0
    for check in checks:
        start = time.perf_counter()
        result: Result = run_check(check, backend_name, quick)
        print(f"{result.line()}  [{time.perf_counter() - start:.1f} s]", flush=True)
        failed += not result.passed
    return failed


def run_property_suite(backend_name: str, expr: str | None, quick: bool,
                       jobs: int = 1) -> bool | None:
    """pytest on the checkout's tests/ under MINIDIST_BACKEND (in ``jobs`` xdist workers
    when more than one): True if it passed, None if there is no tests/ folder or -k
    matched no test."""
    if not TESTS.is_dir():
        print(f"property suite: not run: no tests/ folder next to the package ({TESTS}); "
              "it comes with a source checkout")
        return None
    paths = [f"tests/{p}" for p in QUICK_TESTS] if quick else ["tests"]
    # a file at a time per worker, so that the worlds a test file keeps up start once
    args = ["-m", "pytest", *paths] + (["-k", expr] if expr else []) + \
        (["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 else [])
    print(f"property suite, in {REPO}: MINIDIST_BACKEND={backend_name} python "
          f"{shlex.join(args)}", flush=True)
    env = dict(os.environ, MINIDIST_BACKEND=backend_name)
    code = subprocess.call([sys.executable, *args], cwd=REPO, env=env)
    if code == 5:  # pytest's "no tests collected": -k matched none
        print(f"property suite: no test matches -k {expr!r}")
        return None
    return code == 0


def select(checks: list[Check], expr: str | None) -> list[Check]:
    """The checks whose name matches ``expr``: words match as case-insensitive
    substrings, combined with and / or / not and parentheses."""
    if not expr:
        return list(checks)
    tokens = re.findall(r"[()]|[^\s()]+", expr)
    chosen = []
    for check in checks:
        words = [t if t in ("and", "or", "not", "(", ")") else str(t.lower() in check.name.lower())
                 for t in tokens]
        if eval(" ".join(words), {"__builtins__": {}}):  # only True / False / and / or / not
            chosen.append(check)
    return chosen


def _unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run here, or None."""
    return backend.cupy_unavailable() if name == "cupy" else None
