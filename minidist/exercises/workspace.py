"""The learner's workspace: one file per exercise, and what has passed.

    minidist-exercises/
        ex_35_2_ring_all_reduce.py     written by `start`, edited by the learner
        .progress.json                 {"35.2": "passed", ...}, written by `check`
"""
from __future__ import annotations

import json
import pathlib

DEFAULT_DIR = "minidist-exercises"
PROGRESS = ".progress.json"


def file_of(workspace: pathlib.Path, filename: str) -> pathlib.Path:
    return pathlib.Path(workspace) / filename


def progress(workspace: pathlib.Path) -> dict[str, str]:
    path = pathlib.Path(workspace) / PROGRESS
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}   # a damaged progress file only loses the PASSED marks


def record(workspace: pathlib.Path, exercise_id: str, passed: bool) -> None:
    state = progress(workspace)
    state[exercise_id] = "passed" if passed else "failed"
    path = pathlib.Path(workspace) / PROGRESS
    path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")


def write_starter(workspace: pathlib.Path, filename: str, source: str,
                  force: bool = False) -> tuple[pathlib.Path, bool]:
    """Write the starter file; an existing one is kept unless ``force``. Returns
    (path, whether it was written)."""
    workspace = pathlib.Path(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    path = workspace / filename
    if path.exists() and not force:
        return path, False
    path.write_text(source)
    return path, True
