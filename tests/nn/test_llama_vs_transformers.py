"""minidist's Llama is transformers' Llama: a tiny random LlamaForCausalLM built here (no
network), saved, loaded with Llama.from_pretrained, gives the same logits, loss and
gradient of every parameter; ours saved loads in transformers with the same logits;
greedy decoding gives the same 20 tokens.

float32: max |ours - theirs| / max |theirs| <= 1e-5. float64: <= 1e-12, with the
reference's RMSNorm variance and rotary table lifted to float64 (transformers computes
both in float32 even in a float64 model) and its SDPA attention (the eager one takes
its softmax in float32 too).
"""
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.nn import Llama
from oracles.optional import require, require_transformers_model

torch = require("torch")
transformers = require_transformers_model()
pytest.importorskip("safetensors")


def hf_model(seed=0, dtype=torch.float32, heads=4, kv_heads=2, tie=False, window=None,
             layers=2, hidden=32, theta=10000.0):
    common = dict(vocab_size=53, hidden_size=hidden, intermediate_size=44,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=64, rms_norm_eps=1e-5,
                  rope_theta=theta, tie_word_embeddings=tie, attn_implementation="sdpa")
    torch.manual_seed(seed)
    if window is None:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.MistralForCausalLM(
            transformers.MistralConfig(sliding_window=window, **common))
    with torch.no_grad():          # RMSNorm weights start at 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype)


def lift_to_float64(model):
    """transformers' float32 islands (RMSNorm variance, rotary table) lifted to float64."""
    def rms_forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    def rope_forward(self, x, position_ids):
        dim = self.inv_freq.shape[0] * 2
        inv = 1.0 / (self.config.rope_parameters["rope_theta"]
                     ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].double() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_forward, module)
        if type(module).__name__.endswith("RotaryEmbedding"):
            module.forward = types.MethodType(rope_forward, module)
    return model


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def tokens(seed, batch=2, length=12, vocab=53):
    return np.random.default_rng(seed).integers(0, vocab, (batch, length))


def both_backward(ours, theirs, idx, targets, tol):
    """Forward and backward of both models on the same tokens (the cross-entropy against
    ``targets``); their logits and losses agree within ``tol``, relative."""
    logits, loss = ours(backend.from_host(idx), backend.from_host(targets))
    loss.backward()
    out = theirs(torch.tensor(idx))
    t_loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1),
                                               torch.tensor(targets).flatten())
    t_loss.backward()
    assert rel(backend.to_host(logits.data), out.logits.detach().numpy()) <= tol
    assert abs(float(backend.to_host(loss.data)) - t_loss.item()) <= tol * abs(t_loss.item())


def compare(theirs, tmp_path, dtype, tol, idx, targets):
    theirs.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(str(tmp_path))
    assert ours.config.dtype == dtype
    both_backward(ours, theirs, idx, targets, tol)
    t_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        want = t_params[name].grad.numpy()
        assert rel(backend.to_host(p.grad), want) <= tol * 10, name
    return ours


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 1000), kv=st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 3)]),
       tie=st.booleans(), theta=st.sampled_from([10000.0, 500000.0]))
def test_float64_logits_loss_and_gradients_match_to_1e_12(tmp_path_factory, seed, kv, tie,
                                                         theta):
    theirs = lift_to_float64(hf_model(seed, torch.float64, kv[0], kv[1], tie, theta=theta,
                                      hidden=8 * kv[0]))
    idx, targets = tokens(seed), tokens(seed + 1)
    compare(theirs, tmp_path_factory.mktemp("hf"), "float64", 1e-12, idx, targets)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 1000), tie=st.booleans())
def test_float32_logits_loss_and_gradients_match_to_1e_5(tmp_path_factory, seed, tie):
    theirs = hf_model(seed, torch.float32, tie=tie)
    compare(theirs, tmp_path_factory.mktemp("hf"), "float32", 1e-5, tokens(seed),
            tokens(seed + 1))


def test_sliding_window_matches_mistral(tmp_path):
    theirs = lift_to_float64(hf_model(3, torch.float64, window=4))
    idx = tokens(3, length=16)
    ours = compare(theirs, tmp_path, "float64", 1e-12, idx, tokens(4, length=16))
    assert ours.config.sliding_window == 4


def test_flash_attention_gives_the_same_model(tmp_path):
    theirs = lift_to_float64(hf_model(5, torch.float64))
    theirs.save_pretrained(tmp_path)
    naive = Llama.from_pretrained(str(tmp_path))
    flash = Llama.from_pretrained(str(tmp_path))
    for layer in flash.blocks:
        layer.self_attn.attention = "flash"
    idx = backend.from_host(tokens(5))
    a, b = naive(idx)[0].data, flash(idx)[0].data
    assert np.abs(backend.to_host(a) - backend.to_host(b)).max() <= 1e-12


def test_saved_model_loads_in_transformers_with_the_same_logits(tmp_path):
    theirs = hf_model(7, torch.float64)
    theirs.save_pretrained(tmp_path / "a")
    ours = Llama.from_pretrained(str(tmp_path / "a"))
    ours.save_pretrained(str(tmp_path / "b"))
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "b")
    assert back.dtype == torch.float64
    lift_to_float64(back)
    idx = tokens(7)
    want = backend.to_host(ours(backend.from_host(idx))[0].data)
    assert rel(back(torch.tensor(idx)).logits.detach().numpy(), want) <= 1e-12
    for name, p in back.named_parameters():   # bit for bit
        assert np.array_equal(p.detach().numpy(), backend.to_host(ours.state_dict()[name]))


def test_greedy_decoding_gives_the_same_20_tokens(tmp_path):
    theirs = hf_model(11, torch.float64)
    theirs.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(str(tmp_path))
    prompt = tokens(11, batch=1, length=5)
    want = theirs.generate(torch.tensor(prompt), max_new_tokens=20, do_sample=False,
                           min_new_tokens=20, pad_token_id=0)
    got = ours.generate(backend.from_host(prompt), 20, do_sample=False)
    assert np.array_equal(backend.to_host(got), want.numpy())


def test_sharded_checkpoint_loads_the_same(tmp_path):
    theirs = hf_model(13, torch.float64)
    theirs.save_pretrained(tmp_path / "one")
    theirs.save_pretrained(tmp_path / "many", max_shard_size="20KB")
    assert (tmp_path / "many" / "model.safetensors.index.json").exists()
    one = Llama.from_pretrained(str(tmp_path / "one"))
    many = Llama.from_pretrained(str(tmp_path / "many"))
    for (name, a), (_, b) in zip(one.named_parameters(), many.named_parameters()):
        assert np.array_equal(backend.to_host(a.data), backend.to_host(b.data)), name


def test_dtype_argument_casts_the_checkpoint(tmp_path):
    hf_model(1, torch.float32).save_pretrained(tmp_path)
    ours = Llama.from_pretrained(str(tmp_path), dtype="float64")
    assert all(p.dtype == np.float64 for p in ours.parameters())


def test_bfloat16_checkpoint_loads_widened_to_float32(tmp_path):
    pytest.importorskip("ml_dtypes")
    theirs = hf_model(17, torch.bfloat16)
    theirs.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(str(tmp_path))
    assert ours.config.dtype == "float32"
    t_params = dict(theirs.float().named_parameters())
    for name, p in ours.named_parameters():       # bf16 -> float32 is exact
        assert np.array_equal(backend.to_host(p.data), t_params[name].detach().numpy()), name
    idx = tokens(17)
    want = theirs(torch.tensor(idx)).logits.detach().numpy()
    assert rel(backend.to_host(ours(backend.from_host(idx))[0].data), want) <= 1e-5
    with pytest.raises(ValueError, match="bfloat16 checkpoints load as float32"):
        Llama.from_pretrained(str(tmp_path), dtype="bfloat16")
