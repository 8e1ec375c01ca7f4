"""expert_parallel takes a Llama with MoE layers as it takes the GPT: Mixtral-style top-2
SwiGLU experts spread over the ep ranks, DeepSeek-style shared experts on every rank,
train to the parameters of one process on the whole batch (float64, within 1e-12),
with the balancing loss's counts summed over the ranks. Drawn: the group (2 or 4 ranks,
two or one of the 4 experts each), shared experts, the balancing loss."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per drawn size, kept for the module

B, T, STEPS = 2, 6, 2          # B rows per rank


def _config(case):
    from minidist.nn import LlamaConfig
    return LlamaConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                       num_local_experts=4, num_experts_per_tok=2,
                       n_shared_experts=case["shared"], moe_intermediate_size=6,
                       router_aux_loss_coef=case["aux"], dtype="float64", seed=case["seed"])


def train(case, ep, parallel):
    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn import Llama
    from minidist.optim import AdamW
    from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                          sync_expert_parallel_gradients)
    model = Llama(_config(case))
    rank, n = (dist.get_rank(), dist.get_world_size()) if parallel else (0, 1)
    if parallel:
        mesh = ExpertMesh(ep=n)
        model = expert_parallel(model, mesh)
    opt = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(case["seed"])
    losses = []
    for _ in range(STEPS):
        idx = rng.integers(0, 13, (ep * B, T))
        tgt = np.roll(idx, -1, axis=1)
        rows = slice(rank * B, (rank + 1) * B) if parallel else slice(None)
        _, loss = model(backend.from_host(idx[rows]), backend.from_host(tgt[rows]))
        loss.backward()
        if parallel:
            sync_expert_parallel_gradients(model, mesh)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}, losses


@settings(max_examples=2, deadline=None)
@given(ep=st.sampled_from([2, 4]), shared=st.sampled_from([0, 1, 2]), aux=st.sampled_from([0.0, 0.01]),
       seed=st.integers(0, 100))
def test_expert_parallel_llama_trains_as_one_process(worlds, ep, shared, aux, seed):
    case = dict(shared=shared, aux=aux, seed=seed)
    want, _ = train(case, ep, False)
    for rank, (params, _) in enumerate(worlds(ep).run(train, case, ep, True)):
        assert params, "no parameters"
        for name, got in params.items():       # this rank's experts and every dense one
            diff = np.abs(got - want[name]).max()
            assert diff <= 1e-12, f"rank {rank} {name}: {diff:.2e}; {case}"
