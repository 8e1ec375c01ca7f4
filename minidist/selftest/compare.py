"""Running one computation on two backends, and the two rules that compare them.

A check computes the same thing from the same host inputs twice: on the
backend under test (``cupy`` on a GPU, or ``guard``) and on NumPy. Then:

- **bitwise**, where only data moves or a value is rounded to a format: every
  element must have the same bits on both backends (NaN matches NaN, whatever
  its payload). Rounding and data movement have one right answer; a GPU that
  gives another has a bug.

- **twice**, the flash-attention rule (tests/attention/test_flash.py), where
  matmuls and reductions sum in an order each library picks: against a
  float64 gold result computed on NumPy,

      err(backend) <= 2 * err(numpy) + 1e-6 * scale,    scale = max(1, max |gold|)

  per output, with err = max |result - gold| and the scale taken over all
  outputs of the check (a gradient that is exactly zero still carries
  rounding noise of the size of the other terms). The backend may be a
  little less accurate than NumPy in the same precision, not much.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from minidist import backend

BITWISE = "bitwise"
TWICE = "twice"
FLOOR = 1e-6  # the rule's floor, relative to the largest gold value


@dataclass
class Check:
    """One named comparison.

    ``inputs(quick)`` draws host NumPy arrays (a dict); ``compute(inputs, dtype)``
    runs on the active backend and returns named host arrays. For the ``twice``
    rule it is called with ``dtype="float32"`` on both backends and with
    ``"float64"`` on NumPy for the gold result; for ``bitwise`` with ``None``.
    """
    name: str
    rule: str
    inputs: Callable[[bool], dict]
    compute: Callable[[dict, Any], dict]


@dataclass
class Result:
    name: str
    rule: str
    error: float        # bitwise: max |backend - numpy|; twice: the tightest output's error
    bound: float        # what the error may be: 0 for bitwise, 2 err(numpy) + floor for twice
    passed: bool
    detail: str = ""    # which output was tightest, or how many elements differ

    def line(self) -> str:
        rule = ("bitwise" if self.rule == BITWISE
                else f"<= {self.bound:.2e} (2 x numpy's + floor)")
        verdict = "PASS" if self.passed else "FAIL"
        return (f"  {self.name:<32} max error {self.error:.2e}  {rule:<34} {verdict}"
                f"  {self.detail}").rstrip()


@contextlib.contextmanager
def active_backend(name: str) -> Iterator[None]:
    """Run the body with backend ``name`` active, then switch back."""
    before = backend.get_backend()
    backend.set_backend(name)
    try:
        yield
    finally:
        backend.set_backend(before)


def run_check(check: Check, backend_name: str, quick: bool = True) -> Result:
    """Compute ``check`` on ``backend_name`` and on NumPy from the same inputs; compare."""
    inputs = check.inputs(quick)
    dtype = "float32" if check.rule == TWICE else None
    try:
        with active_backend(backend_name):
            got = check.compute(inputs, dtype)
        with active_backend("numpy"):
            ref = check.compute(inputs, dtype)
            gold = check.compute(inputs, "float64") if check.rule == TWICE else None
    except Exception as e:  # one broken check must not hide the results of the others
        return Result(check.name, check.rule, np.inf, 0.0, False, f"{type(e).__name__}: {e}")
    if check.rule == BITWISE:
        return compare_bitwise(check.name, got, ref)
    return compare_twice(check.name, got, ref, gold)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: the same bits, or both NaN."""
    if a.dtype.kind == "f":
        same = a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")
        return same | (np.isnan(a) & np.isnan(b))
    return a == b


def compare_bitwise(name: str, got: dict, ref: dict) -> Result:
    """PASS if every output of ``got`` has the dtype, shape and bits of ``ref``'s."""
    worst, differing, problems = 0.0, 0, []
    for key, want in ref.items():
        have = got[key]
        if have.dtype != want.dtype or have.shape != want.shape:
            problems.append(f"{key}: {have.dtype}{have.shape} vs {want.dtype}{want.shape}")
            continue
        same = _same_bits(have, want)
        differing += int(same.size - same.sum())
        if not same.all():
            diff = np.abs(have.astype("float64") - want.astype("float64"))[~same]
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max()))
            problems.append(f"{key}: {int(same.size - same.sum())} of {same.size} differ")
    return Result(name, BITWISE, worst, 0.0, not problems, "; ".join(problems))


def compare_twice(name: str, got: dict, ref: dict, gold: dict) -> Result:
    """PASS if each output's error against ``gold`` is at most twice NumPy's, plus the floor."""
    scale = max([1.0] + [float(np.abs(g).max(initial=0)) for g in gold.values()])
    tightest = None   # (error / bound, error, bound, output name)
    for key, g in gold.items():
        err = _max_error(got[key], g)
        bound = 2 * _max_error(ref[key], g) + FLOOR * scale
        if tightest is None or err / bound > tightest[0]:
            tightest = (err / bound, err, bound, key)
    ratio, err, bound, key = tightest
    return Result(name, TWICE, err, bound, ratio <= 1.0, f"tightest: {key}")


def _max_error(result: np.ndarray, gold: np.ndarray) -> float:
    """max |result - gold| in float64; inf if a shape differs or a value is not finite."""
    if result.shape != gold.shape:
        return np.inf
    err = np.abs(result.astype("float64") - gold)
    return float(np.nan_to_num(err, nan=np.inf).max(initial=0))
