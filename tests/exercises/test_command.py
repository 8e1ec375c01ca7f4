"""`minidist exercise list | start | check`: what it prints and its exit status.

0 when the exercise passes (or a command did its work), 1 when a check fails,
2 for a usage error (no such exercise, no file yet, a derive check without
--answer). Uses the single-process exercise 35.17 and the derive exercise 1.2,
so no world is started.
"""
import subprocess
import sys

from minidist.cli import main
from minidist.exercises import find


def _run(capsys, *argv):
    status = main(["exercise", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_list_start_check_and_progress(tmp_path, capsys):
    where = str(tmp_path / "ws")
    status, out, _ = _run(capsys, "list", "--dir", where)
    assert status == 0
    row = next(line for line in out.splitlines() if line.startswith("35.17 "))
    assert row.split()[1:3] == ["debug", "-"]
    assert all(f"\n{i} " in out for i in ("35.12", "35.23", "35.1b", "1.2"))

    status, out, _ = _run(capsys, "start", "35.17", "--dir", where)
    path = tmp_path / "ws" / find("35.17").filename
    assert status == 0 and path.exists() and f"wrote {path}" in out
    status, out, _ = _run(capsys, "start", "35.17", "--dir", where)
    assert status == 0 and "exists (kept)" in out
    status, out, _ = _run(capsys, "list", "--dir", where)
    assert "started" in next(line for line in out.splitlines() if line.startswith("35.17 "))

    status, out, _ = _run(capsys, "check", "35.17", "--dir", where)    # the planted bug
    assert status == 1 and "FAIL" in out and "counterexample:" in out and "not yet" in out

    path.write_text(find("35.17").solution)
    status, out, _ = _run(capsys, "check", "35.17", "--dir", where)
    assert status == 0 and "FAIL" not in out and "passed" in out
    status, out, _ = _run(capsys, "list", "--dir", where)
    assert "passed" in next(line for line in out.splitlines() if line.startswith("35.17 "))


def test_usage_errors_exit_2(tmp_path, capsys):
    where = str(tmp_path)
    for argv, says in [(["check", "99.9"], "no exercise '99.9'"),
                       (["check"], "which exercise?"),
                       (["check", "35.2"], "does not exist; start with"),
                       (["check", "1.2"], "--answer NUMBER")]:
        status, _, err = _run(capsys, *argv, "--dir", where)
        assert status == 2 and says in err, (argv, err)


def test_derive_answer(tmp_path, capsys):
    status, out, _ = _run(capsys, "start", "1.2", "--dir", str(tmp_path))
    assert status == 0 and "--answer" in out
    assert _run(capsys, "check", "1.2", "--answer", "29.3", "--dir", str(tmp_path))[0] == 0
    status, out, _ = _run(capsys, "check", "1.2", "--answer", "112", "--dir", str(tmp_path))
    assert status == 1 and "optimizer state unsharded" in out


def test_the_command_line_exit_status(tmp_path):
    """The installed entry point's status, not main()'s return value."""
    cmd = [sys.executable, "-m", "minidist.cli", "exercise", "check", "nope", "--dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no exercise 'nope'" in done.stderr
    assert "Traceback" not in done.stderr


def test_titles_speak_python_and_the_docs_state_every_exercise():
    """Titles name functions as Python does (ring_all_reduce_time_ms(), not
    ringAllReduceTime()), and docs/exercises.md has a row for every exercise, so
    that a reader without the source documents knows each task."""
    import pathlib
    import re
    from minidist.exercises import DERIVE, EXERCISES
    every = list(EXERCISES) + list(DERIVE)
    camel = [e.title for e in every if re.search(r"\b[a-z]+[A-Z]\w*\(", e.title)]
    assert not camel, camel
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "exercises.md").read_text()
    missing = [e.id for e in every if f"\n| {e.id} |" not in docs]
    assert not missing, f"docs/exercises.md has no row for {missing}"


def test_the_default_workspace_is_ignored_by_git():
    """`minidist exercise start` in a checkout must not leave `git status` dirty."""
    import pathlib
    from minidist.exercises.workspace import DEFAULT_DIR
    ignore = (pathlib.Path(__file__).resolve().parents[2] / ".gitignore").read_text().split()
    assert f"/{DEFAULT_DIR}/" in ignore or f"{DEFAULT_DIR}/" in ignore
