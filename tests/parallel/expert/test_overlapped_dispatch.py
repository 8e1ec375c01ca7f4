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
