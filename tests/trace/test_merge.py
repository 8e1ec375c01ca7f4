"""Reading a trace from anywhere: a gzip that inflates past the cap, a FIFO or a link is
refused at once, and only ``<path>.<pid>.part`` files are taken as parts."""
import gzip
import importlib
import json
import os

import pytest

import minidist.untrusted as untrusted
merge = importlib.import_module("minidist.trace.merge")   # (the package re-exports merge())


def test_a_gzipped_trace_round_trips(tmp_path):
    path = str(tmp_path / "run.json.gz")
    trace = {"traceEvents": [{"ph": "i", "name": "x", "ts": 1.5, "pid": 0, "tid": 0}]}
    merge.write(path, trace)
    assert merge.load(path) == trace
    assert os.listdir(tmp_path) == ["run.json.gz"]          # no temporary left


def test_a_gzipped_trace_is_refused_at_the_cap(tmp_path, monkeypatch):
    """A 200 KB gzip once inflated to 452 MB in memory. The cap (1 GiB) is lowered to
    1 MiB here so the test holds little; the oracle is the inflated size."""
    monkeypatch.setattr(untrusted, "MAX_TRACE_BYTES", 1 << 20)
    path = tmp_path / "run.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"[" + b" " * (1 << 20) + b"]")
    assert path.stat().st_size < 5000
    with pytest.raises(ValueError, match=f"more than {1 << 20} bytes"):
        merge.load(str(path))
    with gzip.open(path, "wb") as f:                        # one byte under: read
        f.write(b"[" + b" " * ((1 << 20) - 3) + b"]")
    assert merge.load(str(path)) == {"traceEvents": []}


@pytest.mark.timeout(20, method="thread")   # (a blocked open ignores signals)
@pytest.mark.parametrize("what", ["trace", "part"])
def test_a_fifo_as_a_trace_or_a_part_is_refused_without_hanging(tmp_path, what):
    path = str(tmp_path / "run.json")
    os.mkfifo(path if what == "trace" else path + ".123.part")
    with pytest.raises(ValueError, match="not a regular file"):
        merge.load(path) if what == "trace" else merge.merge(path)


def test_a_linked_trace_part_is_refused_and_odd_names_are_not_parts(tmp_path):
    path = str(tmp_path / "run.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(json.dumps({"end": True}) + "\n")
    os.symlink(elsewhere, path + ".x.part")                 # not <pid>: not a part
    assert merge.parts_of(path) == []
    os.symlink(elsewhere, path + ".123.part")
    with pytest.raises(ValueError, match="symbolic link"):
        merge.merge(path)
