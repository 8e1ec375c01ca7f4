"""A run with DeepSeek-V3's selection bias (``moe_bias_rate > 0``) resumed from a checkpoint
equals the uninterrupted one bit for bit, in one process and at expert parallelism ep=2:
the routers' ``expert_bias`` is a persistent buffer, saved and loaded with the weights
(lost, the resumed run routes from a zero bias and parts from the straight one)."""
import numpy as np
import pytest

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per size, kept for the module

B, T, STEPS, SAVED = 4, 6, 4, 2      # B rows in all; saved after SAVED of the STEPS steps


def train(world, directory, start, stop):
    """Train steps [start, stop) of a bias-balanced MoE-Llama (built from another seed
    and loaded when ``start > 0``), save after ``stop`` when ``start == 0``; returns the
    parameters and every router's bias."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.checkpoint import load_checkpoint, save_checkpoint
    from minidist.nn import Llama, LlamaConfig
    from minidist.nn.moe import routers
    from minidist.optim import AdamW
    from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                          sync_expert_parallel_gradients)
    cfg = LlamaConfig(vocab_size=13, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=T,
                      num_local_experts=4, num_experts_per_tok=1, moe_intermediate_size=6,
                      moe_bias_rate=0.05, dtype="float64", seed=start)
    model = Llama(cfg)
    rank = dist.get_rank() if world > 1 else 0
    if world > 1:
        mesh = ExpertMesh(ep=world)
        model = expert_parallel(model, mesh)
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    path = f"{directory}/rank{rank}.npz"    # each rank its experts (and the shared rest)
    if start > 0:
        load_checkpoint(path, model, opt)
    for step in range(start, stop):
        idx = np.random.default_rng(step).integers(0, 13, (B, T))
        rows = slice(rank * B // world, (rank + 1) * B // world)
        _, loss = model(backend.from_host(idx[rows]),
                        backend.from_host(np.roll(idx, -1, axis=1)[rows]))
        loss.backward()
        if world > 1:
            sync_expert_parallel_gradients(model, mesh)
        opt.step()
        opt.zero_grad()
        for moe in routers(model):
            moe.update_bias()
    if start == 0 and stop < STEPS:
        save_checkpoint(path, model, opt, rank0_only=False)
    out = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    out.update({f"bias{i}": backend.to_host(m.expert_bias).copy()
                for i, m in enumerate(routers(model))})
    return out


def assert_bitwise(got, want, rank=0):
    assert got.keys() == want.keys()
    for name in want:
        assert np.array_equal(got[name], want[name]), f"rank {rank} {name}"


def test_resumed_bias_balanced_run_equals_the_straight_one_in_one_process(tmp_path):
    straight = train(1, str(tmp_path), 0, STEPS)
    assert any(straight[f"bias{i}"].any() for i in range(2))   # the bias moved
    train(1, str(tmp_path), 0, SAVED)
    assert_bitwise(train(1, str(tmp_path), SAVED, STEPS), straight)


@pytest.mark.parametrize("world", [2], ids=["ep2"])
def test_resumed_bias_balanced_run_equals_the_straight_one_at_ep2(worlds, tmp_path, world):
    straight = worlds(world).run(train, world, str(tmp_path), 0, STEPS)
    worlds(world).run(train, world, str(tmp_path), 0, SAVED)
    resumed = worlds(world).run(train, world, str(tmp_path), SAVED, STEPS)
    for rank, (got, want) in enumerate(zip(resumed, straight)):
        assert_bitwise(got, want, rank)
