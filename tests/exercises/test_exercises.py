"""Every exercise can be passed and can be failed.

For each implement / debug exercise: the library's own implementation, copied
into a workspace, passes ``check``; each wrong version (the planted bug of a
debug exercise, an off-by-one, a forgotten division ...) fails at least one
property, with a counterexample or a report. The starter file fails as "not
implemented" (or, for a debug exercise, as the planted bug) and imports cleanly.
"""
import pytest

from minidist.exercises import EXERCISES
from minidist.exercises.core import Subject
from minidist.exercises.grading import check, report
from minidist.exercises.workspace import write_starter

CASES = [(ex, name) for ex in EXERCISES for name in ex.wrong]


def _subject(tmp_path, ex, source):
    path, _ = write_starter(tmp_path, ex.filename, source, force=True)
    return Subject(path)


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_the_library_implementation_passes(ex, tmp_path):
    results = check(ex, _subject(tmp_path, ex, ex.solution))
    assert all(r.passed for r in results), report(ex, results)


@pytest.mark.parametrize("ex,name", CASES, ids=[f"{ex.id}-{name}" for ex, name in CASES])
def test_a_wrong_implementation_fails_with_a_counterexample(ex, name, tmp_path):
    source = ex.wrong[name] or ex.starter
    results = check(ex, _subject(tmp_path, ex, source))
    failed = [r for r in results if not r.passed]
    assert failed, f"{ex.id}: the wrong version {name!r} passed every property"
    text = report(ex, results)
    assert any(r.example or r.error for r in failed), text   # the case, drawn or fixed
    assert "hint:" in text


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.id)
def test_every_exercise_has_two_wrong_versions_and_a_starter(ex, tmp_path):
    assert len(ex.wrong) >= 2
    results = check(ex, _subject(tmp_path, ex, ex.starter), max_examples=3)
    assert not all(r.passed for r in results)
    if ex.kind == "implement":
        assert "NotImplementedError" in ex.starter
        assert all("not implemented" in r.error for r in results), report(ex, results)
