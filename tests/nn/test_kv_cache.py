"""The key/value cache: a Llama fed its tokens a chunk at a time through a DynamicCache
gives the logits of one forward over the whole sequence (float64, 1e-12), with GQA,
sliding windows, naive and flash attention, MoE layers drawn; generate with
use_cache=True gives the tokens of the no-cache path, greedy and sampled, also past
the context length; the cache keeps only the key/value heads; misuse is refused."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.autograd import no_grad
from minidist.nn import Llama, LlamaConfig
from minidist.nn.kv_cache import DynamicCache

VOCAB, CONTEXT = 17, 12


def llama(kv=2, window=None, attention="naive", experts=0, seed=0):
    return Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=20,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv,
                             max_position_embeddings=CONTEXT, sliding_window=window,
                             attention=attention, num_local_experts=experts, dtype="float64",
                             seed=seed))


@settings(max_examples=5, deadline=None)
@given(kv=st.sampled_from([1, 2, 4]), window=st.sampled_from([None, 1, 3]),
       attention=st.sampled_from(["naive", "flash"]), experts=st.sampled_from([0, 3]),
       cuts=st.lists(st.integers(1, CONTEXT - 1), max_size=3, unique=True),
       batch=st.integers(1, 2), seed=st.integers(0, 100))
def test_chunks_through_the_cache_give_the_whole_forward(kv, window, attention, experts, cuts,
                                                         batch, seed):
    model = llama(kv, window, attention, experts, seed)
    idx = backend.from_host(np.random.default_rng(seed).integers(0, VOCAB, (batch, CONTEXT)))
    with no_grad():
        whole = backend.to_host(model(idx)[0].data)
        cache, pieces = DynamicCache(), []
        bounds = [0, *sorted(cuts), CONTEXT]
        for a, b in zip(bounds[:-1], bounds[1:]):
            pieces.append(backend.to_host(model(idx[:, a:b], past_key_values=cache)[0].data))
    assert cache.get_seq_length() == CONTEXT
    assert np.abs(np.concatenate(pieces, axis=1) - whole).max() <= 1e-12 * np.abs(whole).max()


@settings(max_examples=3, deadline=None)
@given(kv=st.sampled_from([1, 2, 4]), window=st.sampled_from([None, 3]),
       prompt=st.integers(1, 6), new=st.integers(1, 2 * CONTEXT), seed=st.integers(0, 100))
def test_generate_with_the_cache_gives_the_same_tokens(kv, window, prompt, new, seed):
    model = llama(kv, window, seed=seed)
    idx = backend.from_host(np.random.default_rng(seed).integers(0, VOCAB, (2, prompt)))
    for sample in ({"do_sample": False}, {"seed": seed}):       # greedy, then sampled
        without = model.generate(idx, new, use_cache=False, **sample)
        with_cache = model.generate(idx, new, use_cache=True, **sample)
        assert np.array_equal(backend.to_host(with_cache), backend.to_host(without)), sample


def test_the_cache_holds_only_the_key_value_heads():
    model, cache = llama(kv=1), DynamicCache()
    with no_grad():
        model(backend.from_host(np.zeros((2, 5), dtype=np.int64)), past_key_values=cache)
    assert len(cache.layers) == 2
    assert cache.layers[0].keys.shape == (2, 1, 5, 4)          # (B, nkv, T, hd), not nh = 4


def test_misuse_is_refused():
    model = llama()
    idx = backend.from_host(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="for inference: run under no_grad"):
        model(idx, past_key_values=DynamicCache())
    with no_grad():
        with pytest.raises(ValueError, match="one document"):
            model(idx, document_ids=backend.from_host(np.zeros(3, dtype=np.int64)),
                  past_key_values=DynamicCache())
        cache = DynamicCache()
        model(idx, past_key_values=cache)
        with pytest.raises(ValueError, match="start a new DynamicCache"):
            model(idx[:1], past_key_values=cache)
