"""A forward recomputed in backward runs under the precision policy its forward ran under.

Activation checkpointing recomputes each block in backward, after the ``with
autocast(...)`` / ``fp8_autocast`` / ``block_autocast`` block has closed. The
policy captured at forward time is re-entered around the recompute
(autograd/recompute.py, precision/autocast.py), so checkpointed training equals
plain training under the same policy bit for bit; an FP8 recipe's sites, scales
and amax histories end as one forward per step leaves them.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist
from minidist import Tensor, backend
from minidist.autograd import checkpoint
from minidist.nn import functional as F
from minidist.precision import (BlockScaling, CurrentScaling, DelayedScaling, autocast,
                                block_autocast, fp8_autocast, get_autocast_policy)

POLICIES = ["bf16", "fp16", "fp8", "fp8_current", "mxfp8", "nvfp4_sr"]


def make_policy(name: str):
    """(a fresh ``with`` block per step, the recipe object or None)."""
    if name in ("bf16", "fp16"):
        return (lambda: autocast(name)), None
    if name.startswith("fp8"):
        recipe = DelayedScaling(amax_history_len=3) if name == "fp8" else CurrentScaling()
        return (lambda: fp8_autocast(recipe)), recipe
    recipe = (BlockScaling("mxfp8") if name == "mxfp8"
              else BlockScaling("nvfp4", stochastic_grad=True, hadamard=True))
    return (lambda: block_autocast(recipe)), recipe


def block(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """x + W2 gelu(W1 x): two matmul-like sites of the active policy."""
    return x + F.linear(F.gelu(F.linear(x, w1)), w2)


def train(policy: str, use_checkpoint: bool, seed: int, width: int, batch: int, steps: int):
    """Plain SGD on a stack of two blocks; the weights, and the FP8 recipe's state."""
    rng = np.random.default_rng(seed)
    ws = [Tensor(backend.from_host((rng.standard_normal((width, width)) / width)
                                   .astype("float32")), requires_grad=True) for _ in range(4)]
    enter, recipe = make_policy(policy)
    for _ in range(steps):
        x = Tensor(backend.from_host(rng.standard_normal((batch, width)).astype("float32")),
                   requires_grad=True)
        with enter():
            h = x
            for w1, w2 in (ws[:2], ws[2:]):
                h = checkpoint(block, h, w1, w2) if use_checkpoint else block(h, w1, w2)
        (h * h).sum().backward()
        for w in ws:
            w.data = w.data - 0.01 * w.grad
            w.grad = None
    weights = [backend.to_host(w.data).copy() for w in ws]
    state = None
    if isinstance(recipe, DelayedScaling):
        state = [(backend.to_host(s.scale).copy(), backend.to_host(s.amax_history).copy())
                 for site in recipe.sites for s in site["inputs"] + [site["grad"]]]
    return weights, state


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(2, 40), batch=st.integers(1, 40),
       steps=st.integers(1, 3))
def test_checkpointed_training_equals_plain_training_under_the_same_policy(policy, seed, width,
                                                                          batch, steps):
    minidist.manual_seed(seed)
    plain, plain_state = train(policy, False, seed, width, batch, steps)
    minidist.manual_seed(seed)
    ckpt, ckpt_state = train(policy, True, seed, width, batch, steps)
    for a, b in zip(plain, ckpt):
        np.testing.assert_array_equal(a, b)
    if plain_state is not None:     # the same sites, scales and amax histories
        assert len(plain_state) == len(ckpt_state)
        for (s1, h1), (s2, h2) in zip(plain_state, ckpt_state):
            np.testing.assert_array_equal(s1, s2)
            np.testing.assert_array_equal(h1, h2)


@pytest.mark.parametrize("policy", ["bf16", "fp8", "mxfp8"])
def test_without_the_captured_policy_the_recompute_differs(policy, monkeypatch):
    """The check above can fail: a recompute outside the policy (nothing captured, as
    before the fix) trains to other weights."""
    import minidist.autograd.recompute as recompute
    minidist.manual_seed(0)
    plain, _ = train(policy, False, 0, 8, 4, 1)
    monkeypatch.setattr(recompute, "_captures", [])
    minidist.manual_seed(0)
    ckpt, _ = train(policy, True, 0, 8, 4, 1)
    assert any((a != b).any() for a, b in zip(plain, ckpt))
    assert get_autocast_policy() is None     # nothing leaks out of a recompute


def test_a_new_fp8_step_between_forward_and_recompute_is_an_error():
    recipe = DelayedScaling()
    w = Tensor(backend.from_host(np.eye(3, dtype="float32")), requires_grad=True)
    x = Tensor(backend.from_host(np.ones((2, 3), "float32")), requires_grad=True)
    with fp8_autocast(recipe):
        out = checkpoint(lambda t, w: F.linear(t, w), x, w)
    with fp8_autocast(recipe):      # the scales the first forward used are gone
        pass
    with pytest.raises(RuntimeError, match="new fp8_autocast step"):
        out.sum().backward()
    assert get_autocast_policy() is None
