"""Sequence parallelism on a length the tensor-parallel size does not divide is refused
with one error that names the cause and the fix, on every rank: the TP models, their
``generate``, and a ``gpt_tp_plan`` with sequence parallelism (before: a bare shape
mismatch in all_gather, (2, 2, C) against (2, 1, C))."""
import numpy as np
import pytest

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
IDS = np.array([[3, 1, 4], [1, 5, 9]])   # T = 3 over tp = 2


def uneven(kind):
    from minidist.nn import GPT, GPTConfig, LlamaConfig
    from minidist.parallel import TensorParallelGPT, TensorParallelLlama
    gpt = GPTConfig(block_size=8, vocab_size=12, n_layer=1, n_head=2, n_embd=8, seed=1)
    try:
        if kind == "gpt":
            TensorParallelGPT(gpt, None, True)(backend.from_host(IDS))
        elif kind == "llama_generate":
            cfg = LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=12,
                              num_hidden_layers=1, max_position_embeddings=8, seed=1)
            TensorParallelLlama(cfg, None, True).generate(backend.from_host(IDS), 2)
        else:
            from minidist.distributed.device_mesh import init_device_mesh
            from minidist.distributed.tensor.parallel import gpt_tp_plan, parallelize_module
            model = GPT(gpt)
            mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
            parallelize_module(model, mesh, gpt_tp_plan(gpt, 2, sequence_parallel=True))
            model(backend.from_host(IDS))
    except ValueError as e:
        return str(e)
    return None


@pytest.mark.parametrize("kind", ["gpt", "llama_generate", "plan"])
def test_sequence_parallel_on_an_uneven_length_names_cause_and_fix(world, kind):
    for message in world.run(uneven, kind):
        assert message is not None and "length 3 is not a multiple of 2" in message, message
        assert "pad" in message
