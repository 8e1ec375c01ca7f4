"""A tensor-parallel Llama (GQA key/value heads split over the group, sequence parallel
or not) trains to the shards of one process's parameters (float64, within 1e-12: the
row-parallel sums are the dense sums in another order); a split that does not divide
the key/value heads is refused, naming them. Drawn: the group (2 or 4 ranks) with a
GQA ratio it divides, sequence parallelism, a window, documents, tied embeddings."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.nn import LlamaConfig
from minidist.parallel.tensor.llama import check_tensor_parallel
from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per drawn size, kept for the module

B, T, STEPS = 2, 8, 2


def _config(case):
    return LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=case["kv"],
                       sliding_window=case["window"], tie_word_embeddings=case["tie"],
                       max_position_embeddings=T, dtype="float64", seed=case["seed"])


def train(case, parallel):
    """(parameters after STEPS AdamW steps, loss of each step); this rank's shards if parallel."""
    from minidist import backend
    from minidist.nn import Llama
    from minidist.optim import AdamW
    from minidist.parallel.tensor.llama import TensorParallelLlama
    cfg = _config(case)
    model = TensorParallelLlama(cfg, sequence_parallel=case["sp"]) if parallel else Llama(cfg)
    opt = AdamW(model.parameters(), lr=0.01)
    rng = np.random.default_rng(case["seed"])
    docs = np.searchsorted(np.array(sorted(case["cuts"])), np.arange(T), side="right")
    losses = []
    for _ in range(STEPS):
        idx = rng.integers(0, 16, (B, T))
        x, y = backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1))
        _, loss = model(x, y, document_ids=backend.from_host(docs))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(backend.to_host(loss.data)))
    params = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    return params, losses


def sharded_reference(case, dense):
    """The single-process parameters sliced as this rank's tensor-parallel model holds them."""
    from minidist import backend
    from minidist.parallel.tensor.layers import shard_state_dict
    from minidist.parallel.tensor.llama import TensorParallelLlama
    model = TensorParallelLlama(_config(case), sequence_parallel=case["sp"])
    full = {k: backend.from_host(v) for k, v in dense.items()}
    return {k: backend.to_host(v) for k, v in shard_state_dict(model, full).items()}


@settings(max_examples=2, deadline=None)
@given(tp_kv=st.sampled_from([(2, 2), (2, 4), (4, 4)]), sp=st.booleans(), window=st.sampled_from([None, 3]),
       cuts=st.lists(st.integers(1, T - 1), max_size=2, unique=True), tie=st.booleans(),
       seed=st.integers(0, 100))
def test_tensor_parallel_llama_trains_as_one_process(worlds, tp_kv, sp, window, cuts, tie,
                                                     seed):
    tp, kv = tp_kv                            # tp ranks, kv key/value heads of 4 query heads
    case = dict(kv=kv, sp=sp, window=window, cuts=cuts, tie=tie, seed=seed)
    world = worlds(tp)
    dense, dense_losses = train(case, False)
    shards = world.run(sharded_reference, case, dense)
    for rank, (params, losses) in enumerate(world.run(train, case, True)):
        assert np.allclose(losses, dense_losses, rtol=1e-12, atol=0), (losses, dense_losses)
        for name, want in shards[rank].items():
            diff = np.abs(params[name] - want).max()
            assert diff <= 1e-12, f"rank {rank} {name}: {diff:.2e}; {case}"


def test_kv_heads_not_divisible_by_the_group_are_refused():
    check_tensor_parallel(LlamaConfig(num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=64), 2)
    with pytest.raises(ValueError, match="num_key_value_heads=2 is not divisible by the "
                                         "tensor-parallel size 4"):
        check_tensor_parallel(LlamaConfig(num_attention_heads=8, num_key_value_heads=2,
                                          intermediate_size=176, vocab_size=64), 4)
