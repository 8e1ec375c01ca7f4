"""Expert dispatch overlapped with the shared experts equals the plain dispatch bit for bit:
an expert-parallel MoE-Llama with shared experts, trained with ``overlap=True`` and with
``overlap=False`` in the same world, ends with the same losses and parameters, bit for bit
(the same bytes land in the same places; only when they land changes). And
``all_to_all_single(..., async_op=True)`` returns a Work whose ``wait()`` leaves the output
as the blocking call does (torch's semantics). Drawn: ep (2 or 4), shared experts, seed."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per drawn size, kept for the module

B, T, STEPS = 2, 6, 2          # B rows per rank


def train(case, overlap):
    """(parameters after STEPS AdamW steps, the losses) of this rank's expert-parallel Llama."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn import Llama, LlamaConfig
    from minidist.optim import AdamW
    from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                          sync_expert_parallel_gradients)
    cfg = LlamaConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                      num_local_experts=4, num_experts_per_tok=2,
                      n_shared_experts=case["shared"], moe_intermediate_size=6,
                      dtype="float64", seed=case["seed"])
    rank, ep = dist.get_rank(), dist.get_world_size()
    mesh = ExpertMesh(ep=ep)
    model = expert_parallel(Llama(cfg), mesh, overlap=overlap)
    opt = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(case["seed"])
    losses = []
    for _ in range(STEPS):
        idx = rng.integers(0, 13, (ep * B, T))[rank * B:(rank + 1) * B]
        _, loss = model(backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1)))
        loss.backward()
        sync_expert_parallel_gradients(model, mesh)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}, losses


@settings(max_examples=3, deadline=None)
@given(ep=st.sampled_from([2, 4]), shared=st.sampled_from([1, 2]), seed=st.integers(0, 100))
def test_overlapped_dispatch_trains_bit_for_bit_as_the_plain_one(worlds, ep, shared, seed):
    case = dict(shared=shared, seed=seed)
    world = worlds(ep)
    plain, overlapped = world.run(train, case, False), world.run(train, case, True)
    for rank, ((want, want_losses), (got, losses)) in enumerate(zip(plain, overlapped)):
        assert losses == want_losses, (rank, losses, want_losses)
        for name, value in got.items():
            assert np.array_equal(value, want[name]), f"rank {rank} {name}; {case}"


def async_all_to_all(seed):
    """(a Work came back, its output equals the blocking call's) on this rank."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.backend import xp
    n, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(seed + r)
    x = backend.from_host(rng.standard_normal((3 * n, 2)))
    blocking, background = xp.empty_like(x), xp.empty_like(x)
    dist.all_to_all_single(blocking, x)
    work = dist.all_to_all_single(background, x, async_op=True)
    is_work = isinstance(work, dist.Work)
    work.wait()
    return is_work, bool((backend.to_host(blocking) == backend.to_host(background)).all())


def test_all_to_all_single_async_op_returns_a_work_that_waits_for_the_same_output(worlds):
    for is_work, same in worlds(2).run(async_all_to_all, 7):
        assert is_work and same


def traced_dispatch(overlap):
    """One forward and backward of a 2-layer expert-parallel Llama with a shared expert,
    recorded: (name, cat, thread, start, end) of its dispatch spans and of the shared
    experts' forwards, and the summary's exposed time per dispatch wait."""
    import os
    import shutil
    import tempfile

    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn import Llama, LlamaConfig
    from minidist.parallel.expert import ExpertMesh, expert_parallel
    from minidist.trace import recorder as trace
    from minidist.trace.merge import read_part
    from minidist.trace.summary import summarize
    cfg = LlamaConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                      num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      moe_intermediate_size=6, dtype="float64", seed=0)
    model = expert_parallel(Llama(cfg), ExpertMesh(ep=dist.get_world_size()), overlap=overlap)
    idx = np.random.default_rng(dist.get_rank()).integers(0, 13, (B, T))
    folder = tempfile.mkdtemp()
    rec = trace.start(os.path.join(folder, "step.json"))
    try:
        model(backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1)))[1].backward()
    finally:
        trace.stop()
    events, _ = read_part(rec.part)
    shutil.rmtree(folder)
    spans = [(e["name"], e["cat"], e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and (e["name"].startswith("MoE dispatch")
                                        or e["name"].endswith("mlp.shared"))]
    row, = summarize(dict(traceEvents=[dict(e, pid=0) for e in events]))["ranks"].values()
    return spans, row["exposed_in_waits"].get("MoE dispatch")


def test_each_dispatch_is_a_unit_wait_span_around_the_shared_expert_when_overlapped(worlds):
    """A span "MoE dispatch unit k" (cat "moe", the main thread) per MoE layer and
    forward: the summary cuts the exposed communication by it, one figure per layer; the
    overlapped dispatch has the shared expert's forward inside it, the plain one not."""
    for overlap in (False, True):
        for spans, waits in worlds(2).run(traced_dispatch, overlap):
            dispatches = [s for s in spans if s[0].startswith("MoE dispatch")]
            assert [(s[0], s[1], s[2]) for s in dispatches] == [
                ("MoE dispatch unit 0", "moe", 0), ("MoE dispatch unit 1", "moe", 0)]
            assert waits is not None and len(waits) == 2 and min(waits) >= 0
            shared = [s for s in spans if s[0].endswith("mlp.shared")]
            inside = [any(d[3] <= s[3] and s[4] <= d[4] for d in dispatches) for s in shared]
            assert len(shared) == 2 and inside == [overlap, overlap], (overlap, spans)
