"""``minidist trace``: a missing or broken file is a message, not a traceback; plot
writes an image."""
import json
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "minidist.cli", "trace", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_missing_or_broken_file_is_a_usage_error(tmp_path):
    out = run("summary", str(tmp_path / "none.json"))
    assert out.returncode == 2 and "no trace at" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = run("plot", str(bad), str(tmp_path / "x.png"))
    assert out.returncode == 2 and "not a trace: not JSON" in out.stderr
    out = run("merge", str(tmp_path / "none.json"))
    assert out.returncode == 2 and "no trace parts" in out.stderr


def test_a_file_that_is_not_a_trace_is_named_so_and_merge_is_not_suggested(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other = tmp_path / "config.json"
    other.write_text('{"name": "not a trace"}')
    for path, why in ((text, "not JSON"), (other, "JSON without a list of traceEvents")):
        out = run("summary", str(path))
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"{path} is not a trace: {why}" in out.stderr and "merge" not in out.stderr


def test_a_run_that_left_parts_is_pointed_to_merge(tmp_path):
    trace = tmp_path / "run.json"
    (tmp_path / "run.json.0.part").write_text("")
    out = run("summary", str(trace))
    assert out.returncode == 2 and f"minidist trace merge {trace}" in out.stderr


def test_check_summary_and_plot_of_a_small_trace(tmp_path):
    pytest.importorskip("matplotlib")
    ev = [{"ph": "X", "name": "F0", "cat": "pipeline", "ts": 0, "dur": 10, "pid": 0, "tid": 0,
           "args": {"group": [0], "step": 0}},
          {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    assert run("check", str(path)).returncode == 0
    assert "pipeline bubble, stages [0], step 0: 0.000" in run("summary", str(path)).stdout
    assert run("plot", str(path), str(tmp_path / "t.png")).returncode == 0
    assert (tmp_path / "t.png").stat().st_size > 1000
