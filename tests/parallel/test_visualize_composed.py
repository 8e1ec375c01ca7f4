"""visualize_sharding of a composed model: the blocks of a weight and the ranks holding
them, read off the model's own slicing, agree with the layout: tp cuts q_proj's rows, FSDP
cuts each tp slice's rows over dp_shard, and only the stage holding the layer holds it;
an expert is whole on the ranks of its ep group's member.

8 ranks: pp=2 x dp_shard=2 x tp=2, ep=2 (rank = 4 pp + 2 dp_shard + tp).
"""
import numpy as np
import pytest

from minidist.comm import World
from minidist.parallel.compose.visualize import block_text, sharding_table


def texts(names):
    from minidist.nn import Llama, LlamaConfig
    from minidist.parallel import parallelize_llama
    from minidist.parallel.compose.parallel_dims import ParallelDims
    from minidist.parallel.compose.visualize import sharding_text
    cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                      num_experts_per_tok=2, max_position_embeddings=8, dtype="float64",
                      tie_word_embeddings=False)
    dims = ParallelDims(pp=2, dp_shard=2, tp=2, ep=2)
    model = parallelize_llama(Llama(cfg), dims.build_mesh(), dims)
    return [sharding_text(model, name) for name in names]


@pytest.fixture(scope="module")
def shown():
    names = ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight",
             "model.layers.1.mlp.experts.3.gate_proj.weight"]
    with World(8, timeout=60.0, run_timeout=240.0) as world:
        return world.run(texts, names)


def test_every_rank_draws_the_same_table(shown):
    assert all(rank == shown[0] for rank in shown)


def test_q_proj_is_cut_by_tp_then_fsdp_on_the_first_stage_only(shown):
    q, _, _ = shown[0]
    assert q.splitlines() == [
        "model.layers.0.self_attn.q_proj.weight (16, 16)",
        "block                   ranks",
        "[0:4, 0:16]             0",           # tp 0's rows [0:8), FSDP's first half
        "[8:12, 0:16]            1",           # tp 1's rows [8:16), first half
        "[4:8, 0:16]             2",
        "[12:16, 0:16]           3",
        "not held by             4, 5, 6, 7"]


def test_a_norm_is_whole_over_tp_and_an_expert_whole_on_its_ep_rank(shown):
    _, norm, expert = shown[0]
    assert "[0:8]                   4, 5" in norm and "[8:16]                  6, 7" in norm
    assert "[0:32, 0:16]            6, 7" in expert     # expert 3: ep rank 1 (dp_shard 1)


def test_a_piece_that_is_not_a_rectangle_lists_its_ranges():
    mask = np.zeros((6, 4), dtype=bool)
    mask[0:2] = mask[4:6] = True                    # a tp rank's heads of a fused q, k, v
    assert block_text(mask) == "[0:2+4:6, 0:4]"
    mask[0, 0] = False
    assert block_text(mask) == "(15 scattered elements)"
    table, empty = sharding_table([mask, np.zeros_like(mask), mask])
    assert table == [("(15 scattered elements)", [0, 2])] and empty == [1]
