"""Run an exercise's properties against a subject and report each one.

Hypothesis draws the inputs (a bounded number of examples, derandomised so a
check gives the same verdict twice). When a property fails, hypothesis shrinks
the input and replays the smallest failing one last; the wrapper below keeps
the arguments of the last failing call, which is that minimal counterexample.
A hang, a crash inside a rank, or a ``NotImplementedError`` ends the property
at once (``Stop``), unshrunk: shrinking a hang would wait for every timeout.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from minidist.exercises.core import Exercise, Property, Stop, Subject, close_worlds


@dataclasses.dataclass
class Result:
    prop: Property
    passed: bool
    example: dict | None = None   # the minimal counterexample, when one was drawn
    error: str = ""

    def lines(self) -> list[str]:
        if self.passed:
            return [f"  PASS  {self.prop.name}"]
        out = [f"  FAIL  {self.prop.name}"]
        if self.example:
            shown = ", ".join(f"{k}={_short(v)}" for k, v in self.example.items())
            out.append(f"        counterexample: {shown}")
        for line in self.error.strip().splitlines():
            out.append(f"        {line}")
        if self.prop.hint:
            out.append(f"        hint: {self.prop.hint}")
        return out


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    if hasattr(value, "shape") and hasattr(value, "tolist"):
        text = f"array(shape={tuple(value.shape)}, values={value.tolist()!r})"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_property(prop: Property, subject: Any, max_examples: int | None = None,
                 shrink: bool = True) -> Result:
    """Check one property of ``subject``; never raises for a wrong subject.
    ``max_examples`` overrides the property's own count; ``shrink=False`` keeps
    the first failing example instead of the smallest (a quicker verdict)."""
    failing: dict = {}

    def body(**drawn: Any) -> None:
        try:
            prop.check(subject, **drawn)
        except NotImplementedError as e:
            raise Stop(f"not implemented yet: {str(e) or 'the body still raises NotImplementedError'}")
        except Exception:
            failing.clear()
            failing.update(drawn)
            raise

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")   # the learner's overflow warnings are not the verdict
            _run_hypothesis(prop, body, max_examples, shrink)
    except Stop as e:
        return Result(prop, False, None, str(e))
    except Exception as e:  # AssertionError from the property, or the subject's own error
        return Result(prop, False, dict(failing) or None, _describe(e))
    return Result(prop, True)


def _run_hypothesis(prop: Property, body, max_examples: int | None, shrink: bool) -> None:
    from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings
    if not prop.given:
        body()
        return
    for case in reversed(prop.explicit):
        body = example(**case)(body)
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())
    test = settings(max_examples=max_examples or prop.examples, deadline=None,
                    database=None, derandomize=True, verbosity=Verbosity.quiet,
                    phases=phases,
                    suppress_health_check=list(HealthCheck),
                    print_blob=False)(given(**prop.given)(body))
    test()


def _describe(e: BaseException) -> str:
    exceptions = getattr(e, "exceptions", None)  # hypothesis found several distinct failures
    if exceptions:
        e = exceptions[0]
    if isinstance(e, AssertionError):
        return str(e) or "assertion failed"
    return f"{type(e).__name__}: {e}"


def check(exercise: Exercise, subject: Any, max_examples: int | None = None, *,
          cap: int | None = None, shrink: bool = True,
          until_failure: bool = False) -> list[Result]:
    """Every property of ``exercise`` against ``subject``; stops the worlds after
    (unless inside ``core.shared_worlds()``).

    For the project's own tests: ``cap`` lowers each property's example count
    to at most ``cap``, ``shrink=False`` skips the search for the smallest
    counterexample, ``until_failure`` stops at the first property that fails.
    """
    try:
        try:
            if isinstance(subject, Subject):
                subject.module  # a syntax error is reported once, not per property
        except Exception as e:
            fake = Property("the module imports", lambda s: None,
                            hint="run `python FILE` to see the error with its line")
            return [Result(fake, False, None, f"{type(e).__name__}: {e}")]
        results = []
        for p in exercise.properties:
            n = max_examples or (min(p.examples, cap) if cap else None)
            results.append(run_property(p, subject, n, shrink))
            if until_failure and not results[-1].passed:
                break
        return results
    finally:
        close_worlds(unless_shared=True)


def report(exercise: Exercise, results: list[Result]) -> str:
    lines = [f"{exercise.id} {exercise.title} ({exercise.kind})"]
    for r in results:
        lines += r.lines()
    passed = sum(r.passed for r in results)
    verdict = "passed" if passed == len(results) else "not yet"
    lines.append(f"{passed} of {len(results)} properties hold: {verdict}")
    if exercise.docs and passed < len(results):
        lines.append(f"read: {exercise.docs}")
    return "\n".join(lines)
