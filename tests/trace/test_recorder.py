"""The recorder in one process: off costs nothing but a branch, on it names modules by
their dotted path, both ends of a message compute one flow id, and ``record`` leaves
one merged file (gzipped for .gz)."""
import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import trace
from minidist.backend import xp
from minidist.trace import recorder
from minidist.trace.check import check


def test_recording_is_off_unless_started():
    assert recorder.active is None


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 63), st.integers(0, 63), st.integers(0, 9), st.integers(0, 1 << 26),
       st.integers(0, 1000))
def test_flow_ids_fit_in_a_double_and_tell_messages_apart(src, dst, ctx, tag, n):
    fid = recorder.flow_id(src, dst, ctx, tag, n)
    assert 0 <= fid < 1 << 53
    assert fid == recorder.flow_id(src, dst, ctx, tag, n)
    assert fid != recorder.flow_id(src, dst, ctx, tag, n + 1)
    assert fid != recorder.flow_id(dst + 64, src, ctx, tag, n)


def test_module_spans_are_named_by_their_dotted_path(tmp_path):
    from minidist.nn import GPT, GPTConfig
    cfg = GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=8)
    model = GPT(cfg)
    idx = xp.zeros((1, 8), dtype="int64")
    path = str(tmp_path / "one.json.gz")
    with trace.record(path):
        model(idx)
    with gzip.open(path, "rt") as f:
        t = json.load(f)
    assert check(t) == []
    names = {e["name"] for e in t["traceEvents"] if e.get("cat") == "module"}
    submodules = {name for name, _ in model.named_modules() if name}
    assert "GPT" in names and names - {"GPT"} <= submodules
    assert {"blocks.0.attn", "blocks.1.mlp.c_fc", "lm_head"} <= names
    assert recorder.active is None


def test_an_exception_leaving_record_is_an_instant_event(tmp_path):
    path = str(tmp_path / "fail.json")
    with pytest.raises(ValueError):
        with trace.record(path):
            raise ValueError("bad batch")
    events = trace.load(path)["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "i"] == ["ValueError: bad batch"]


def test_record_refuses_a_second_file_while_recording(tmp_path):
    with trace.record(str(tmp_path / "a.json")):
        with pytest.raises(RuntimeError, match="already recording"):
            trace.start(str(tmp_path / "b.json"))
