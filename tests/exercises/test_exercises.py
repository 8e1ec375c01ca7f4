"""Every exercise can be passed and can be failed.

For each implement / debug exercise: the library's own implementation, copied
into a workspace, passes ``check`` (and a debug exercise's starter with only
its planted bug fixed passes too); each wrong version (the planted bug, an
off-by-one, a forgotten division ...) fails at least one property, with a
counterexample or a report. The starter file fails as "not implemented" (or,
for a debug exercise, as the planted bug) and imports cleanly.

All checks in this file share their worlds of processes, and those graded
on processes draw at most ``MINIDIST_EXERCISE_EXAMPLES`` examples per property
(3 unless set; the single-process ones keep their own count): the
properties are derandomised, so the first few examples are the same every
run. Whether a wrong version fails does not depend on the array backend, so
those cases run under the NumPy backend only; the library's implementation
passes under every backend.
"""
import os

import pytest

from minidist import backend
from minidist.exercises import EXERCISES
from minidist.exercises.core import Subject, shared_worlds
from minidist.exercises.grading import check, report
from minidist.exercises.workspace import write_starter

CAP = int(os.environ.get("MINIDIST_EXERCISE_EXAMPLES", "3"))
HANG_TIMEOUT_S = 1.5     # a wrong version that hangs: stopped after this long without progress
numpy_only = pytest.mark.skipif(backend.get_backend() != "numpy",
                                reason="a wrong version fails the same way on every backend")


@pytest.fixture(scope="module", autouse=True)
def _one_world_per_size():
    """A world of each size is started once for the whole file, not once per check."""
    with shared_worlds():
        yield


def _cap(ex):
    """Fewer examples where each costs a world's run; the others are quick."""
    return CAP if ex.processes else None


def _subject(tmp_path, ex, source, tag):
    path, _ = write_starter(tmp_path / tag, ex.filename, source, force=True)
    return Subject(path)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_the_library_implementation_passes(ex, tmp_path):
    sources = {"solution": ex.solution, **({"fixed starter": ex.fixed} if ex.fixed else {})}
    for tag, source in sources.items():
        results = check(ex, _subject(tmp_path, ex, source, tag.replace(" ", "_")), cap=_cap(ex))
        assert all(r.passed for r in results), f"{tag}:\n" + report(ex, results)


@numpy_only
@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_every_wrong_version_fails_with_a_counterexample(ex, tmp_path):
    assert len(ex.wrong) >= 2, f"{ex.id}: at least two wrong versions"
    for i, (name, source) in enumerate(ex.wrong.items()):
        if "hangs" in name:
            continue
        results = check(ex, _subject(tmp_path, ex, source or ex.starter, f"w{i}"),
                        cap=_cap(ex), shrink=False, until_failure=True)
        failed = [r for r in results if not r.passed]
        assert failed, f"{ex.id}: the wrong version {name!r} passed every property"
        text = report(ex, results)
        assert any(r.example or r.error for r in failed), text   # the case, drawn or fixed
        assert "hint:" in text


@numpy_only
@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_the_starter_imports_and_fails(ex, tmp_path):
    if "" in ex.wrong.values():      # a debug starter is its planted bug, failed above
        assert _subject(tmp_path, ex, ex.starter, "starter").module
        return
    results = check(ex, _subject(tmp_path, ex, ex.starter, "starter"), cap=_cap(ex), shrink=False)
    assert not all(r.passed for r in results)
    assert not any(r.prop.name == "the module imports" for r in results), report(ex, results)
    if ex.kind == "implement":
        assert "NotImplementedError" in ex.starter
        assert all("not implemented" in r.error for r in results), report(ex, results)


HANGS = [(ex, name) for ex in EXERCISES for name in ex.wrong if "hangs" in name]


@numpy_only
@pytest.mark.parametrize("ex,name", HANGS, ids=[f"{ex.id}-{name}" for ex, name in HANGS])
def test_a_hang_is_stopped_and_reported(ex, name, tmp_path):
    """One property is enough: the first that runs the code on a world."""
    with shared_worlds(timeout=HANG_TIMEOUT_S):
        results = check(ex, _subject(tmp_path, ex, ex.wrong[name], "hang"), cap=1,
                        until_failure=True)
    assert "hung" in results[-1].error and "stopped after its timeout" in results[-1].error, \
        report(ex, results)


def test_a_counterexample_is_shrunk_to_the_smallest(tmp_path):
    """Hypothesis shrinks a failing example: the planted bug of 35.17 shows with one gradient."""
    ex = next(e for e in EXERCISES if e.id == "35.17")
    results = check(ex, _subject(tmp_path, ex, ex.starter, "starter"))
    failed = [r for r in results if not r.passed and r.example]
    assert failed and failed[0].example == {"kind": "inf"}, report(ex, results)


def test_the_reading_pointer_is_a_docs_page_not_the_solution():
    """A learner is sent to the docs and the workbook, never to the library file that
    solves the exercise (a debug exercise may name the mechanism its bug is about)."""
    for ex in EXERCISES:
        if ex.kind == "implement":
            assert "minidist/" not in ex.docs, (ex.id, ex.docs)
        assert ex.docs.startswith("docs/"), (ex.id, ex.docs)
