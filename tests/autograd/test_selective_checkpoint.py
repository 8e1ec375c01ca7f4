"""Selective activation checkpointing: bit for bit no checkpointing, and Korthikanti's bytes.

The policy keeps the results of the named ops (matmuls and attention by default,
torchtitan's op_sac_save_list; or every other matmul) and recomputes the rest.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.autograd.activation_checkpoint import checkpoint
from minidist.autograd.saved_bytes import saved_bytes
from minidist.autograd.selective_checkpoint import SavePolicy
from minidist.autograd.tensor import Tensor
from minidist.calc import activation_memory_per_layer, minidist_layer_activation_bytes
from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
from minidist.nn.cost_probe import layer_saved_bytes, step_matmul_flops
from minidist.nn.functional import dropout
from minidist.nn.gpt import Block

POLICIES = {"none": "no checkpoint", "full": None, "selective": SavePolicy(),
            "every other matmul": SavePolicy(every_other_matmul=True)}


def _block_grads(cfg, mode, seed):
    block = Block(cfg, backend.Generator(0))
    backend.default_generator().set_state(backend.Generator(seed).get_state())   # dropout
    x = Tensor(backend.Generator(seed).normal((2, cfg.block_size, cfg.n_embd),
                                              dtype="float64"), requires_grad=True)
    y = block(x) if mode == "none" else checkpoint(block, x, policy=POLICIES[mode])
    (y * y).sum().backward()
    return [x.grad] + [q.grad for q in block.parameters()]


@settings(max_examples=4, deadline=None)
@given(attention=st.sampled_from(["naive", "flash"]), heads=st.sampled_from([1, 2]),
       dropout=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**16))
def test_selective_checkpoint_of_a_gpt_block_is_bit_for_bit_no_checkpoint(attention, heads,
                                                                          dropout, seed):
    cfg = GPTConfig(block_size=6, n_embd=8, n_head=heads, attention=attention,
                    dropout=dropout, dtype="float64")
    want = _block_grads(cfg, "none", seed)
    for mode in ("full", "selective", "every other matmul"):
        got = _block_grads(cfg, mode, seed)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), mode


def _model_step(make, checkpoint_option, seed):
    model = make(checkpoint_option)
    rng = np.random.default_rng(seed)
    idx, tgt = rng.integers(0, 11, (2, 4)), rng.integers(0, 11, (2, 4))
    _, loss = model(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    return [backend.to_host(q.grad) for q in model.parameters()]


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_checkpoint_selective_config_trains_gpt_and_llama_bit_for_bit(seed):
    def gpt(option):
        return GPT(GPTConfig(block_size=4, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                             dtype="float64", seed=1, checkpoint=option))

    def llama(option):
        return Llama(LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                                 num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, max_position_embeddings=4,
                                 dtype="float64", seed=1, checkpoint=option))
    for make in (gpt, llama):
        want = _model_step(make, False, seed)
        got = _model_step(make, "selective", seed)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), make.__name__


@pytest.mark.parametrize("s,h,a", [(64, 32, 4), (32, 16, 2)])
def test_saved_bytes_per_layer_are_korthikantis_within_named_buffers(s, h, a):
    """Korthikanti's terms at e bytes an element, no masks (dropout 0): 16 e sbh
    (selective) + the 2 buffers selective keeps besides (attention's O before the
    heads merge, the MLP projection's output) + flash's logsumexp; none: + GELU's
    tanh(u) 4 sbh and LayerNorm's 1/std 2 sb, one a s^2 b (P, no dropout copy);
    full: the block input."""
    b, e = 2, 4                                     # float32
    sbh, sb = s * b * h, s * b

    def korthikanti(recompute):
        return activation_memory_per_layer(s, b, h, a, recompute=recompute,
                                           bytes_per_element=e, mask_bytes=0)
    selective = layer_saved_bytes(s, b, h, a, attention="flash", checkpoint="selective")
    assert selective == korthikanti("selective") + e * (2 * sbh + a * sb)
    assert selective == minidist_layer_activation_bytes(s, b, h, a, flash=True,
                                                        recompute="selective")
    naive = layer_saved_bytes(s, b, h, a, checkpoint="selective")
    assert naive == minidist_layer_activation_bytes(s, b, h, a, recompute="selective")
    none = layer_saved_bytes(s, b, h, a)
    assert none == korthikanti("none") + e * (4 * sbh + 2 * sb - a * s * s * b)
    assert layer_saved_bytes(s, b, h, a, checkpoint=True) == korthikanti("full")
    # what selective keeps lies between full and none, the scores dropped with flash
    assert korthikanti("full") < selective < layer_saved_bytes(s, b, h, a, attention="flash")


def test_every_other_matmul_keeps_fewer_bytes_than_every_matmul():
    all_mm = layer_saved_bytes(32, 2, 16, 2, checkpoint="selective")
    block = Block(GPTConfig(block_size=32, n_embd=16, n_head=2), backend.Generator(0))
    x = Tensor(backend.Generator(1).normal((2, 32, 16)), requires_grad=True)
    y = checkpoint(block, x, policy=SavePolicy(every_other_matmul=True))
    assert saved_bytes(y, exclude=block.parameters()) < all_mm


def test_a_policy_naming_an_op_that_does_not_exist_is_refused():
    block = Block(GPTConfig(block_size=4, n_embd=8, n_head=2), backend.Generator(0))
    x = Tensor(backend.Generator(1).normal((1, 4, 8)), requires_grad=True)
    with pytest.raises(ValueError, match=r"no op named \['Matmul'\]"):
        checkpoint(block, x, policy=SavePolicy(save=("Linear", "Matmul")))
    with pytest.raises(ValueError, match="checkpoint is False, True / 'full' or 'selective'"):
        GPTConfig(checkpoint="sometimes")
    with pytest.raises(ValueError, match="checkpoint is False, True / 'full' or 'selective'"):
        LlamaConfig(checkpoint="selctive")


@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_selective_recomputes_no_matmul_and_full_recomputes_the_forward(attention):
    """Matmul FLOPs of a step: selective (matmuls and attention kept) runs no more
    than no checkpointing; full runs the forward's once more (eq. 3 with recompute)."""
    b, s, layers, h, a, vocab = 2, 16, 2, 16, 2, 23
    none = step_matmul_flops(b, s, layers, h, a, vocab, attention=attention)
    selective = step_matmul_flops(b, s, layers, h, a, vocab, attention=attention,
                                  checkpoint="selective")
    full = step_matmul_flops(b, s, layers, h, a, vocab, attention=attention, checkpoint=True)
    assert selective == none < full


def test_a_kept_random_op_moves_the_generator_on_so_later_draws_repeat():
    """Dropout kept: the recompute does not run it, yet the noise drawn after it
    must be the forward's noise (the generator is moved on as the op moved it)."""
    def fn(x):
        y = dropout(x, 0.5)                                        # kept, not rerun
        noise = Tensor(backend.default_generator().random(x.shape, dtype="float64"))
        return (y * noise).tanh()

    def grad(policy):
        backend.default_generator().set_state(backend.Generator(9).get_state())
        x = Tensor(backend.Generator(4).normal((3, 5), dtype="float64"), requires_grad=True)
        y = fn(x) if policy == "none" else checkpoint(fn, x, policy=policy)
        y.sum().backward()
        return x.grad
    want = grad("none")
    assert np.array_equal(grad(SavePolicy(save=("Dropout",))), want)
    assert np.array_equal(grad(None), want)
