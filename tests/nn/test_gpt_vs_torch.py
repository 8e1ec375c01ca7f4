"""The small GPT equals the same model written in PyTorch, weight for weight.

float64: logits, loss and every parameter gradient agree to 1e-10 (the two
sum in different orders, so bitwise equality is not expected; 1e-10 is ~1e6
ulps of float64 headroom for a few thousand accumulated terms).
float32: agree to float32 rounding of a few-thousand-term sum (rtol 1e-4).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.nn import GPT, GPTConfig
from oracles.optional import require

torch = require("torch")
from oracles.torch_gpt import torch_copy_of  # noqa: E402


def _compare(cfg, batch, seq, seed, rtol, atol):
    model = GPT(cfg)
    tmodel = torch_copy_of(model)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, cfg.vocab_size, (batch, seq))
    tgt = rng.integers(0, cfg.vocab_size, (batch, seq))

    logits, loss = model(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    tlogits, tloss = tmodel(torch.from_numpy(idx), torch.from_numpy(tgt))
    tloss.backward()

    np.testing.assert_allclose(backend.to_host(logits.data), tlogits.detach().numpy(),
                               rtol=rtol, atol=atol)
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=rtol, atol=atol)
    tparams = dict(tmodel.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(backend.to_host(p.grad), tparams[name].grad.numpy(),
                                   rtol=rtol, atol=atol, err_msg=name)


@settings(max_examples=6)
@given(n_layer=st.integers(1, 2), n_head=st.sampled_from([1, 2, 4]),
       head_size=st.sampled_from([2, 4]), seq=st.integers(1, 8), batch=st.integers(1, 3),
       tie=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_gpt_forward_backward_matches_torch_float64(n_layer, n_head, head_size, seq, batch,
                                                    tie, bias, seed):
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=n_layer, n_head=n_head,
                    n_embd=n_head * head_size, tie_weights=tie, bias=bias,
                    dtype="float64", seed=seed)
    _compare(cfg, batch, seq, seed, rtol=1e-10, atol=1e-12)


def test_gpt_forward_backward_matches_torch_float32():
    cfg = GPTConfig(block_size=16, vocab_size=17, n_layer=2, n_head=4, n_embd=32)
    _compare(cfg, batch=3, seq=16, seed=1, rtol=1e-4, atol=1e-6)


def test_gpt_rejects_a_sequence_longer_than_its_block():
    cfg = GPTConfig(block_size=4, vocab_size=5, n_layer=1, n_head=1, n_embd=4)
    with pytest.raises(ValueError, match="block_size"):
        GPT(cfg)(backend.from_host(np.zeros((1, 5), dtype=np.int64)))
