"""A parameter the forward leaves out trains under expert parallelism as in one process:
a dense weight no rank used keeps no gradient (one process leaves its grad None and
AdamW skips it; a zero there let AdamW's weight decay move it on the ep side alone), and
an expert no token reached on any rank gets the zero gradient one process gives it (it
runs on zero rows) and is decayed as there. An MoE-Llama with shared experts, one expert
kept from every token by its selection bias and an unused Linear beside it, trained with
AdamW(weight_decay=0.1) at ep=2 and dp x ep = 2 x 2, overlap off and on, against one
process on the whole batch (float64, within 1e-12)."""
import numpy as np
import pytest

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per size, kept for the module

B, T, STEPS, SKIPPED = 2, 6, 2, 3      # B rows per rank; expert 3 gets no token


def train(world, ep, overlap):
    """(parameters after STEPS steps, the unused weight's grad is None, expert 3's grad)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn import Linear, Llama, LlamaConfig
    from minidist.nn.moe import routers
    from minidist.optim import AdamW
    from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                          sync_expert_parallel_gradients)
    cfg = LlamaConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                      num_local_experts=4, num_experts_per_tok=1, n_shared_experts=1,
                      moe_intermediate_size=6, dtype="float64", seed=0)
    model = Llama(cfg)
    model.unused = Linear(8, 8, bias=False, dtype="float64")
    model.unused.weight.data[...] = backend.from_host(np.ones((8, 8)))
    for moe in routers(model):         # the selection bias keeps expert 3 from every token
        moe.bias_rate = 1e-9
        moe.expert_bias[SKIPPED] = -1e9
    rank = dist.get_rank() if world > 1 else 0
    if world > 1:
        mesh = ExpertMesh(ep=ep, dp=world // ep)
        model = expert_parallel(model, mesh, overlap=overlap)
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(0)
    for _ in range(STEPS):
        idx = rng.integers(0, 13, (4 * B, T))
        rows = slice(None) if world == 1 else slice(rank * 4 * B // world,
                                                    (rank + 1) * 4 * B // world)
        _, loss = model(backend.from_host(idx[rows]),
                        backend.from_host(np.roll(idx, -1, axis=1)[rows]))
        loss.backward()
        if world > 1:
            sync_expert_parallel_gradients(model, mesh)
        grads = {k: p.grad for k, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    skipped = [backend.to_host(g) for k, g in grads.items() if f"experts.{SKIPPED}." in k]
    return ({k: backend.to_host(p.data).copy() for k, p in model.named_parameters()},
            grads["unused.weight"] is None, skipped)


@pytest.mark.parametrize("world,ep", [(2, 2), (4, 2)], ids=["ep2", "dp2xep2"])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_unused_parameters_train_as_one_process(worlds, world, ep, overlap):
    want, none, skipped = train(1, 1, False)
    assert none and skipped and all(g is not None and not g.any() for g in skipped)
    for rank, (params, none, skipped) in enumerate(worlds(world).run(train, world, ep, overlap)):
        assert none, f"rank {rank}: the unused weight has a gradient"
        assert all(g is not None and not g.any() for g in skipped)   # zeros where it lives
        assert np.array_equal(params["unused.weight"], want["unused.weight"]), rank
        for name, got in params.items():       # this rank's experts and every dense one
            diff = np.abs(got - want[name]).max()
            assert diff <= 1e-12, f"rank {rank} {name}: {diff:.2e}"
