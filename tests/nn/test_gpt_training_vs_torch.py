"""Several optimizer steps on the GPT match the same steps in PyTorch.

The same weights, batches and hyperparameters go through minidist's GPT +
optimizer and PyTorch's. After k steps every parameter must agree:
float64 to 1e-10, float32 to 2e-5 relative (float32 rounding of
differently ordered sums, compounded over a few steps; AdamW divides by
sqrt(v) + eps, which amplifies differences in tiny gradients, hence atol).
"""
import numpy as np
import pytest

from minidist import backend
from minidist.nn import GPT, GPTConfig
from minidist.optim import SGD, AdamW, clip_grad_norm_
from oracles.optional import require

torch = require("torch")
from oracles.torch_gpt import torch_copy_of  # noqa: E402

STEPS = 4


def _train_both(cfg, make_opts, clip=None, seed=0):
    model = GPT(cfg)
    tmodel = torch_copy_of(model)
    opt, topt = make_opts(model, tmodel)
    rng = np.random.default_rng(seed)
    for _ in range(STEPS):
        idx = rng.integers(0, cfg.vocab_size, (2, cfg.block_size))
        tgt = rng.integers(0, cfg.vocab_size, (2, cfg.block_size))
        _, loss = model(backend.from_host(idx), backend.from_host(tgt))
        opt.zero_grad()
        loss.backward()
        _, tloss = tmodel(torch.from_numpy(idx), torch.from_numpy(tgt))
        topt.zero_grad()
        tloss.backward()
        if clip is not None:
            clip_grad_norm_(model.parameters(), clip)
            torch.nn.utils.clip_grad_norm_(tmodel.parameters(), clip)
        opt.step()
        topt.step()
    return model, tmodel


def _assert_same_params(model, tmodel, rtol, atol):
    tparams = dict(tmodel.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(backend.to_host(p.data), tparams[name].detach().numpy(),
                                   rtol=rtol, atol=atol, err_msg=name)


def _sgd(model, tmodel):
    kw = dict(lr=0.1, momentum=0.9, weight_decay=0.01)
    return SGD(model.parameters(), **kw), torch.optim.SGD(tmodel.parameters(), **kw)


def _adamw(model, tmodel):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return AdamW(model.parameters(), **kw), torch.optim.AdamW(tmodel.parameters(), **kw)


CFG = dict(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=16)


@pytest.mark.parametrize("make_opts", [_sgd, _adamw], ids=["sgd", "adamw"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_gpt_steps_match_torch_float64(make_opts, clip):
    model, tmodel = _train_both(GPTConfig(dtype="float64", **CFG), make_opts, clip)
    _assert_same_params(model, tmodel, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make_opts,bias,atol", [(_sgd, True, 2e-6), (_adamw, False, 1e-5)],
                         ids=["sgd", "adamw"])
def test_gpt_steps_match_torch_float32(make_opts, bias, atol):
    # AdamW runs without biases in float32: the key part of c_attn.bias has a
    # gradient that is exactly zero in exact arithmetic (adding a constant to
    # every key's score leaves softmax unchanged), so in float32 it is pure
    # rounding noise, which Adam's m / sqrt(v) normalises into +-lr steps whose
    # signs differ between any two implementations.
    # For the same reason AdamW's atol is lr / 1000: its step m / sqrt(v) does
    # not shrink with the gradient, so an element whose gradients are tiny
    # carries their float32 relative error into a step of size ~lr.
    model, tmodel = _train_both(GPTConfig(bias=bias, **CFG), make_opts, clip=1.0)
    _assert_same_params(model, tmodel, rtol=2e-5, atol=atol)
