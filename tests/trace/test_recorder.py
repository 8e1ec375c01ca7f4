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


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 3), st.booleans())
def test_every_module_in_backward_has_a_backward_span(tmp_path_factory, layers, input_grad):
    """Fed a plain input (no gradient wanted) or not, each module with parameters
    gets one backward span per backward, after its forward; a leaf fed a plain input
    is its one op's backward; nothing stays hooked."""
    import time

    from minidist.autograd.tensor import Tensor
    from minidist.backend import Generator
    from minidist.nn import GPT, GPTConfig, Linear, Sequential
    gpt = GPT(GPTConfig(block_size=8, vocab_size=16, n_layer=layers, n_head=2, n_embd=8))
    mlp = Sequential(*[Linear(4, 4, generator=Generator(i)) for i in range(layers)])
    x = Tensor(Generator(9).normal((2, 4)), requires_grad=input_grad)
    idx = xp.zeros((1, 8), dtype="int64")
    done = []   # when the first layer's weight has its gradient (a hook before the trace's)
    mlp[0].weight.register_post_accumulate_grad_hook(lambda p: done.append(time.perf_counter()))
    path = str(tmp_path_factory.mktemp("bwd") / "bwd.json")
    with trace.record(path):
        for _ in range(2):
            gpt(idx, idx)[1].backward()
        mlp(x).sum().backward()
    t = trace.load(path)
    assert check(t) == []
    spans = [e for e in t["traceEvents"] if e.get("cat") == "module" and e["ph"] == "X"]
    backward = [e["name"][:-len(" backward")] for e in spans if e["name"].endswith(" backward")]
    forward_end = {}   # called modules (not the ModuleList) -> ends of their forwards
    for e in spans:
        if not e["name"].endswith(" backward"):
            forward_end.setdefault(e["name"], []).append(e["ts"] + e["dur"])
    with_params = {name or type(model).__name__: 2 if model is gpt else 1
                   for model in (gpt, mlp) for name, m in model.named_modules()
                   if any(True for _ in m.parameters())
                   and (name or type(model).__name__) in forward_end}
    assert {n: backward.count(n) for n in set(backward)} == with_params
    for e in spans:
        if e["name"].endswith(" backward"):
            assert e["ts"] >= min(forward_end[e["name"][:-len(" backward")]])
    # each step's backward span of a GPT module lies in its parent's (the first step's
    # leaves are marked, the second's have their one op timed)
    by_name = {}
    for e in spans:
        by_name.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
    for name, _ in gpt.named_modules():
        if f"{name} backward" in by_name and name:
            parent = name.rsplit(".", 1)[0] if "." in name else "GPT"
            parent = parent if f"{parent} backward" in by_name else "GPT"
            for (s, e), (ps, pe) in zip(by_name[f"{name} backward"],
                                        by_name[f"{parent} backward"]):
                assert ps <= s <= e <= pe, (name, parent)
    first = next(e for e in spans if e["name"] == "0 backward")
    origin = t["otherData"]["origin_perf_counter_us"]
    # a leaf fed a plain input is timed as its one op, whose backward makes its
    # parameters' gradients: it ends before they are added into .grad; a marked
    # one ends at its input's mark, after them
    end = first["ts"] + first["dur"] + origin
    if input_grad:
        assert end >= done[-1] * 1e6 - 1e-3
    else:
        assert end <= done[-1] * 1e6 + 1e-3
    assert all(len(p._hooks) == (p is mlp[0].weight) for p in mlp.parameters())
    assert all(not p._hooks for p in gpt.parameters())


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


def test_a_split_backward_leaves_no_span_across_its_b_and_w_passes(tmp_path):
    """Under a B/W split (zero-bubble pipelines) each backward span lies in the B pass
    or in the W pass: a module fed a plain input, whose own gradients all come in W,
    has none rather than one that straddles the ops run between the two passes."""
    import time

    from minidist.autograd.tensor import Tensor
    from minidist.autograd.weight_grad import backward_split
    from minidist.backend import Generator
    from minidist.nn import Linear, Sequential
    model = Sequential(Linear(4, 4, generator=Generator(0)), Linear(4, 4, generator=Generator(1)))
    x = Tensor(Generator(2).normal((3, 4)))
    passes = []
    with trace.record(str(tmp_path / "split.json")):
        for _ in range(2):   # the first call of each leaf is marked, the second timed
            loss = model(x).sum()
            t0 = time.perf_counter()
            w = backward_split(loss, weights=model.parameters())
            t1 = time.perf_counter()
            w.run()
            passes += [(t0, t1), (t1, time.perf_counter())]
    t = trace.load(str(tmp_path / "split.json"))
    assert check(t) == []
    origin = t["otherData"]["origin_perf_counter_us"]
    backward = [e for e in t["traceEvents"] if e["ph"] == "X" and e["name"].endswith("backward")]
    assert {e["name"] for e in backward} >= {"1 backward"}
    for e in backward:
        start, end = (e["ts"] + origin) / 1e6, (e["ts"] + e["dur"] + origin) / 1e6
        assert any(a - 1e-6 <= start <= end <= b + 1e-6 for a, b in passes), e["name"]


def test_a_link_planted_at_the_part_name_is_not_written_through(tmp_path):
    """The part's name is predictable (<path>.<pid>.part): a link there is refused,
    and the file it points at is left as it was."""
    import os
    victim = tmp_path / "victim"
    victim.write_text("someone's data")
    path = str(tmp_path / "run.json")
    os.symlink(victim, recorder.part_path(path, os.getpid()))
    with pytest.raises(OSError):
        trace.start(path)
    assert recorder.active is None
    assert victim.read_text() == "someone's data"
