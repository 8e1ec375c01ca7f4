"""Generating from a model split by vocabulary gives one process's tokens on every rank.

Each tensor-parallel rank's forward returns V/t logit columns; an argmax (or a draw)
over them returns a local index of a wrong token. ``TensorParallelLlama.generate`` and
``TensorParallelGPT.generate`` all-gather each step's columns; a plan with a
``vocab_parallel_loss`` head returns a DTensor, which ``generate`` gathers whole. Greedy
and sampled, with and without the KV cache; the loss under ``loss_parallel`` is a
DTensor whose ``item()`` is one process's loss.
"""
import numpy as np
import pytest

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
NEW = 5


def _llama_config():
    from minidist.nn import LlamaConfig
    return LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8,
                       dtype="float64", seed=2)


def _gpt_config():
    from minidist.nn import GPTConfig
    return GPTConfig(block_size=8, vocab_size=12, n_layer=1, n_head=2, n_embd=8,
                     dtype="float64", seed=2)


PROMPT = np.array([[3, 1, 4], [1, 5, 9]])


def _generated(model, sample, **kw):
    out = model.generate(backend.from_host(PROMPT), NEW, do_sample=sample, seed=4, **kw)
    return backend.to_host(out).tolist()


def one_process(kind, sample):
    from minidist.nn import GPT, Llama
    if kind == "gpt":
        return _generated(GPT(_gpt_config()), sample)
    return _generated(Llama(_llama_config()), sample)


def tensor_parallel(kind, sample):
    from minidist.parallel import TensorParallelGPT, TensorParallelLlama
    if kind == "gpt":
        return _generated(TensorParallelGPT(_gpt_config()), sample)
    if kind == "llama_no_cache":
        return _generated(TensorParallelLlama(_llama_config()), sample, use_cache=False)
    return _generated(TensorParallelLlama(_llama_config()), sample)


def vocab_parallel_plan(sample):
    """A Llama under llama_tp_plan(vocab_parallel_loss=True): generate and the loss."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import (llama_tp_plan, loss_parallel,
                                                      parallelize_module)
    from minidist.nn import Llama
    cfg = _llama_config()
    model = Llama(cfg)
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, llama_tp_plan(cfg, 2, vocab_parallel_loss=True))
    with loss_parallel():
        _, loss = model(backend.from_host(PROMPT), backend.from_host(PROMPT[:, ::-1].copy()))
    return _generated(model, sample), loss.item()


@pytest.mark.parametrize("kind", ["llama", "llama_no_cache", "gpt"])
@pytest.mark.parametrize("sample", [False, True])
def test_tensor_parallel_generate_equals_one_process(world, kind, sample):
    want = one_process("gpt" if kind == "gpt" else "llama", sample)
    assert world.run(tensor_parallel, kind, sample) == [want, want]


@pytest.mark.parametrize("sample", [False, True])
def test_generate_and_item_under_a_vocab_parallel_loss_plan(world, sample):
    from minidist.nn import Llama
    single = Llama(_llama_config())
    _, loss = single(backend.from_host(PROMPT), backend.from_host(PROMPT[:, ::-1].copy()))
    want = one_process("llama", sample)
    for tokens, value in world.run(vocab_parallel_plan, sample):
        assert tokens == want
        assert abs(value - loss.item()) <= 1e-12, (value, loss.item())
