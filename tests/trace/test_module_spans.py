"""Each module's backward is one span per backward, nested in its thread's spans.

A traced GPT step, two steps each (the first call of a module is marked, later
calls of a one-op leaf are timed): under fully_shard (one unit per block, then the
root), under DDP, and in one process with lm_head tied to wte. In each, the file
passes ``trace check`` (spans nest per thread) and every module that has
parameters has exactly one "<name> backward" span per backward on every rank.
Also under fully_shard: two sibling modules fed token ids, each an embedding and
a Linear, whose parameters' gradients all land after the unit's one reduce-scatter.
"""
from collections import Counter

import pytest

from minidist import trace
from minidist.comm import World
from minidist.trace.check import check

STEPS = 2


def gpt_steps(how: str) -> list:
    """``STEPS`` GPT steps on this rank; the names of the modules with parameters."""
    from minidist.backend import Generator, xp
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import SGD
    cfg = GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=8,
                    dtype="float64", tie_weights=True)
    model = run = GPT(cfg)
    if how == "fsdp":
        from minidist.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif how == "ddp":
        from minidist.parallel import DistributedDataParallel
        run = DistributedDataParallel(model)
    opt = SGD(model.parameters(), lr=0.1)
    gen = Generator(3)
    for _ in range(STEPS):
        idx = xp.asarray(gen.integers(0, 16, (2, 8)))
        _, loss = run(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()
    from minidist.nn import ModuleList
    outer = "module." if how == "ddp" else ""   # (DDP is the outermost module)
    return [outer + name for name, m in model.named_modules()   # (a ModuleList is never called)
            if name and not isinstance(m, ModuleList) and any(True for _ in m.parameters())] \
        + [outer[:-1] or "GPT"]


def branches_steps(how: str) -> list:
    """Two siblings fed plain input, ``(a(idx) + b(idx)).sum()``, one fully_shard unit."""
    from minidist.backend import xp
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import Embedding, Linear, Module, Sequential

    class Branches(Module):
        def __init__(self):
            super().__init__()
            self.a = Sequential(Embedding(16, 8, "float64"), Linear(8, 8, dtype="float64"))
            self.b = Sequential(Embedding(16, 8, "float64"), Linear(8, 8, dtype="float64"))

        def forward(self, idx):
            return (self.a(idx) + self.b(idx)).sum()
    model = fully_shard(Branches())
    for _ in range(STEPS):
        model(xp.zeros((2, 4), dtype="int64")).backward()
    return ["a", "a.0", "a.1", "b", "b.0", "b.1", "Branches"]


def _backward_spans(t: dict, pid: int) -> Counter:
    return Counter(e["name"][:-len(" backward")] for e in t["traceEvents"]
                   if e.get("pid") == pid and e.get("ph") == "X"
                   and e["name"].endswith(" backward") and e.get("cat") == "module")


def _assert_one_span_per_backward(t: dict, pids: list, names: list) -> None:
    assert check(t) == []
    for pid in pids:
        spans = _backward_spans(t, pid)
        for name in names:
            assert spans[name] == STEPS, (pid, name, spans)


@pytest.mark.parametrize("how", ["fsdp", "ddp", "branches"])
def test_a_traced_data_parallel_gpt_step_nests_one_backward_per_module(tmp_path, how):
    out = str(tmp_path / "run.json")
    with trace.record(out):
        with World(2, timeout=30.0, run_timeout=120.0) as world:
            names = world.run(branches_steps if how == "branches" else gpt_steps, how)[0]
    t = trace.load(out)
    pids = sorted({e["pid"] for e in t["traceEvents"] if e.get("name") == names[0] + " backward"})
    assert len(pids) == 2
    _assert_one_span_per_backward(t, pids, names)


def test_a_traced_step_with_tied_weights_nests_one_backward_per_module(tmp_path):
    out = str(tmp_path / "run.json")
    with trace.record(out):
        names = gpt_steps("plain")
    assert "lm_head" in names and "wte" in names
    t = trace.load(out)
    pids = sorted({e["pid"] for e in t["traceEvents"] if e.get("name") == "wte backward"})
    _assert_one_span_per_backward(t, pids, names)
