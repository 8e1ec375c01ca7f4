"""A pipelined (3D) model saved by stage: ``save_checkpoint`` of a model a pipeline split
refuses (one file from rank 0 would hold stale copies of the other stages), and
``save_pipeline`` / ``load_pipeline`` give back every stage's trained weights bit for
bit: at the same layout (with the optimizer: the next step is bit for bit the
uninterrupted run's) and at another pipeline degree (pp 2 -> 1, each rank the whole
model)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

STEPS, M = 2, 2

worlds = worlds_fixture()


def _config(case):
    from minidist.nn import GPTConfig, LlamaConfig
    if case["model"] in ("llama", "moe"):     # moe: routed by a moving selection bias
        moe = dict(num_local_experts=4, num_experts_per_tok=1, moe_intermediate_size=6,
                   moe_bias_rate=0.05) if case["model"] == "moe" else {}
        return LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                           num_hidden_layers=case["layers"], num_attention_heads=2,
                           num_key_value_heads=1, max_position_embeddings=4,
                           tie_word_embeddings=case["tie"], dtype="float64", seed=case["seed"],
                           **moe)
    return GPTConfig(block_size=4, vocab_size=11, n_layer=case["layers"], n_head=2, n_embd=8,
                     tie_weights=case["tie"], dtype="float64", seed=case["seed"])


def _batch(rng):
    from minidist import backend
    idx = rng.integers(0, 11, (2 * M, 4))
    return backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1))


def _host(three_d):
    from minidist import backend
    return {**{n: backend.to_host(q.data).copy() for n, q in three_d.named_parameters().items()},
            **{n: backend.to_host(b).copy() for n, b in three_d.named_buffers().items()}}


def save_and_reload(case, directory):
    """pp = 2: train, try save_checkpoint (refused), save_pipeline; reload into a fresh
    model at the same layout and take one more step on both."""
    from minidist.checkpoint import (CheckpointError, load_pipeline, save_checkpoint,
                                     save_pipeline)
    from minidist.comm import DeviceMesh
    from minidist.optim import AdamW
    from minidist.parallel.three_d import ThreeDParallelGPT
    cfg, rng = _config(case), np.random.default_rng(case["seed"])
    model = ThreeDParallelGPT(cfg, DeviceMesh(pp=2), M)
    opt = AdamW(model.parameters(), lr=0.02)
    for _ in range(STEPS):
        model.train_step(*_batch(rng), opt)
    with pytest.raises(CheckpointError, match="save_pipeline") as refused:
        save_checkpoint(f"{directory}/one_file.ckpt", model.model, opt)
    save_pipeline(directory, model, opt)
    trained = _host(model)
    again = ThreeDParallelGPT(cfg, DeviceMesh(pp=2), M)
    opt_again = AdamW(again.parameters(), lr=0.02)
    load_pipeline(directory, again, opt_again)
    loaded = _host(again)
    batch = _batch(rng)
    model.train_step(*batch, opt)
    again.train_step(*batch, opt_again)
    return str(refused.value), trained, loaded, _host(model), _host(again)


def load_whole(case, directory):
    """pp = 1 (dp = 2): every rank loads the whole model from the two stages' files."""
    from minidist.checkpoint import load_pipeline
    from minidist.comm import DeviceMesh
    from minidist.parallel.three_d import ThreeDParallelGPT
    model = ThreeDParallelGPT(_config(case), DeviceMesh(dp=2), M)
    load_pipeline(directory, model)
    return _host(model)


@settings(max_examples=3, deadline=None)
@given(model=st.sampled_from(["gpt", "llama"]), layers=st.integers(2, 3), tie=st.booleans(),
       seed=st.integers(0, 100))
def test_pipeline_checkpoint_holds_every_stage_and_loads_bit_for_bit(worlds, tmp_path_factory,
                                                                     model, layers, tie, seed):
    check_saved_and_loaded(worlds, tmp_path_factory,
                           dict(model=model, layers=layers, tie=tie, seed=seed))


def test_pipeline_checkpoint_keeps_the_routers_selection_bias(worlds, tmp_path_factory):
    """Each stage's routers' ``expert_bias`` (persistent buffers) saved and loaded with its
    weights: the step after loading routes as the uninterrupted run's."""
    check_saved_and_loaded(worlds, tmp_path_factory,
                           dict(model="moe", layers=2, tie=False, seed=3))


def check_saved_and_loaded(worlds, tmp_path_factory, case):
    directory = str(tmp_path_factory.mktemp("pipeline"))
    stages = worlds(2).run(save_and_reload, case, directory)
    whole = {}
    for message, trained, loaded, stepped, stepped_again in stages:
        assert "split over 2 pipeline stages" in message
        if case["model"] == "moe":
            assert any(trained[n].any() for n in trained if n.endswith("expert_bias"))
        assert trained.keys() == loaded.keys()
        for name in trained:
            assert np.array_equal(loaded[name], trained[name]), name
            assert np.array_equal(stepped_again[name], stepped[name]), name
        whole.update(trained)
    for params in worlds(2).run(load_whole, case, directory):
        assert params.keys() == whole.keys()
        for name, value in params.items():
            assert np.array_equal(value, whole[name]), name
