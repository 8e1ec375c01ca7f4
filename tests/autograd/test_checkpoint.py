"""Activation checkpointing: the same gradients, bit for bit, in less memory.

``checkpoint(block, x)`` keeps only ``x`` during forward and recomputes the
block's activations in backward, replaying the default generator so dropout
draws the same mask. Nothing in the arithmetic changes, so the gradients must
be identical to running the blocks directly, not merely close.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minidist
from minidist import Tensor, backend
from minidist.autograd import checkpoint, ops

from .strategies import FEWER, randn, seeds


def make_blocks(n_blocks: int, width: int, dtype: str, seed: int) -> list[dict]:
    """Weights (leaves that require grad) of a stack of residual MLP blocks."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(n_blocks):
        hidden = 4 * width
        blocks.append({
            "w1": rng.standard_normal((hidden, width)) / np.sqrt(width),
            "b1": rng.standard_normal(hidden) * 0.1,
            "w2": rng.standard_normal((width, hidden)) / np.sqrt(hidden),
            "b2": rng.standard_normal(width) * 0.1,
        })
    return [{k: Tensor(v.astype(dtype), requires_grad=True) for k, v in b.items()}
            for b in blocks]


def mlp_block(x: Tensor, params: dict, p_drop: float) -> Tensor:
    """x + W2 dropout(gelu(W1 x + b1)) + b2: the MLP half of a transformer block."""
    h = ops.Linear.apply(x, params["w1"], params["b1"])        # (B, 4C)
    h = ops.Gelu.apply(h)
    if p_drop > 0:
        h = ops.Dropout.apply(h, p=p_drop)                     # default generator
    return x + ops.Linear.apply(h, params["w2"], params["b2"])  # (B, C)


def forward(x: Tensor, blocks: list[dict], p_drop: float, use_checkpoint: bool) -> Tensor:
    h = x
    for params in blocks:
        if use_checkpoint:
            h = checkpoint(lambda t, params=params: mlp_block(t, params, p_drop), h)
        else:
            h = mlp_block(h, params, p_drop)
    return h


def loss_and_grads(x_host, blocks, upstream, p_drop, use_checkpoint, seed):
    for params in blocks:
        for t in params.values():
            t.grad = None
    minidist.manual_seed(seed)                 # the same dropout masks in both runs
    x = Tensor(x_host, requires_grad=True)
    out = forward(x, blocks, p_drop, use_checkpoint)
    out.backward(backend.from_host(upstream))
    grads = {"x": backend.to_host(x.grad).copy()}
    for i, params in enumerate(blocks):
        for name, t in params.items():
            grads[f"{name}[{i}]"] = backend.to_host(t.grad).copy()
    return out.numpy(), grads


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@FEWER
@given(n_blocks=st.integers(1, 4), width=st.integers(1, 6), batch=st.integers(1, 4),
       p_drop=st.sampled_from([0.0, 0.25, 0.5]), seed=seeds)
def test_checkpoint_gives_bitwise_identical_gradients(dtype, n_blocks, width, batch,
                                                      p_drop, seed):
    blocks = make_blocks(n_blocks, width, dtype, seed)
    x_host = randn(seed + 1, (batch, width), dtype)
    upstream = randn(seed + 2, (batch, width), dtype)
    out_plain, plain = loss_and_grads(x_host, blocks, upstream, p_drop, False, seed)
    out_ckpt, ckpt = loss_and_grads(x_host, blocks, upstream, p_drop, True, seed)
    np.testing.assert_array_equal(out_ckpt, out_plain)
    assert ckpt.keys() == plain.keys()
    for name in plain:
        assert ckpt[name].dtype == plain[name].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(ckpt[name], plain[name], err_msg=name)


def block_with_side_output(x: Tensor, params: dict, p_drop: float) -> tuple[Tensor, Tensor, Tensor]:
    """The MLP block, a value the loss adds that is computed inside it (as a router's
    balancing loss is), and one that needs no gradient."""
    h = ops.Gelu.apply(ops.Linear.apply(x, params["w1"], params["b1"]))   # (B, 4C)
    side = (h * h).mean()                                                 # a scalar
    if p_drop > 0:
        h = ops.Dropout.apply(h, p=p_drop)
    return x + ops.Linear.apply(h, params["w2"], params["b2"]), side, Tensor(h.data.max())


@FEWER
@given(n_blocks=st.integers(1, 3), width=st.integers(1, 5), batch=st.integers(1, 3),
       p_drop=st.sampled_from([0.0, 0.5]), seed=seeds)
def test_a_checkpoint_returning_several_outputs_gives_the_gradient_of_each(n_blocks, width, batch,
                                                                        p_drop, seed):
    """checkpoint(fn) with fn returning a tuple, as torch's: the loss uses the second
    output, so its gradient must reach the block's weights through the recompute.
    Equal to rounding, not bit for bit: an activation both outputs use sums its
    gradients in the order the backward meets them, which one root per output
    changes (read off after a checkpoint, the second output's share would be
    missing altogether: off by far more than rounding)."""
    blocks = make_blocks(n_blocks, width, "float64", seed)
    x_host = randn(seed + 1, (batch, width), "float64")

    def grads(use_checkpoint):
        for params in blocks:
            for t in params.values():
                t.grad = None
        minidist.manual_seed(seed)
        h, loss = Tensor(x_host, requires_grad=True), None
        for params in blocks:
            run = lambda t, params=params: block_with_side_output(t, params, p_drop)  # noqa: E731
            h, side, _ = checkpoint(run, h) if use_checkpoint else run(h)
            loss = side if loss is None else loss + side
        loss = loss * 3.0 + (h * h).sum()
        loss.backward()
        return [backend.to_host(t.grad).copy() for params in blocks for t in params.values()]

    for plain, ckpt in zip(grads(False), grads(True)):
        # a gradient that cancels to near 0 keeps the rounding of its larger terms:
        # absolute error to the scale of the array (n_blocks=2, width=5, batch=2,
        # p_drop=0.5, seed=29: 6e-15 off at an entry near 0)
        scale = max(1.0, float(np.abs(plain).max()))
        np.testing.assert_allclose(ckpt, plain, rtol=1e-13, atol=1e-14 * scale)


def test_checkpoint_replays_the_dropout_mask_and_leaves_the_generator_as_it_was():
    blocks = make_blocks(1, 4, "float64", 0)
    fn = lambda t: mlp_block(t, blocks[0], 0.5)  # noqa: E731
    x = Tensor(randn(0, (3, 4)), requires_grad=True)
    minidist.manual_seed(7)
    out = checkpoint(fn, x)
    state_after_forward = backend.default_generator().get_state()
    out.sum().backward()                       # recompute draws the same mask
    # backward restored the generator: a later draw is the one it would have been
    assert backend.default_generator().get_state() == state_after_forward

    minidist.manual_seed(7)
    np.testing.assert_array_equal(fn(Tensor(x.numpy())).numpy(), out.numpy())


def test_checkpoint_fires_parameter_hooks_once():
    blocks = make_blocks(2, 3, "float64", 0)
    fired = []
    for i, params in enumerate(blocks):
        for name, t in params.items():
            t.register_post_accumulate_grad_hook(lambda t, key=(i, name): fired.append(key))
    x = Tensor(randn(0, (2, 3)), requires_grad=True)
    forward(x, blocks, 0.0, use_checkpoint=True).sum().backward()
    assert sorted(fired) == sorted((i, n) for i in range(2) for n in blocks[0])
    assert [i for i, _ in fired] == [1] * 4 + [0] * 4   # last block first


def peak_bytes(blocks, x_host, upstream, use_checkpoint: bool) -> int:
    """Peak array memory of forward + backward (the parameters exist before)."""
    for params in blocks:
        for t in params.values():
            t.grad = None
    minidist.manual_seed(0)
    with backend.MemoryTracker() as mem:
        # on CuPy the tracker samples; sample at the likely peaks (no-op on CPU)
        for params in blocks:
            for t in params.values():
                t.register_post_accumulate_grad_hook(lambda t: mem.sample())
        x = Tensor(x_host, requires_grad=True)
        out = forward(x, blocks, 0.1, use_checkpoint)
        mem.sample()
        out.backward(backend.from_host(upstream))
        del out, x
    for params in blocks:
        for t in params.values():
            t._hooks.clear()
    return mem.peak


def test_checkpointing_every_block_lowers_peak_memory():
    # 8 blocks of width 256 (hidden 1024) on a batch of 512, float32: each
    # block keeps ~10 MB of activations for backward without checkpointing,
    # and only its 0.5 MB input with it.
    n_blocks, width, batch = 8, 256, 512
    blocks = make_blocks(n_blocks, width, "float32", 0)
    x_host = randn(1, (batch, width), "float32")
    upstream = randn(2, (batch, width), "float32")

    plain = peak_bytes(blocks, x_host, upstream, use_checkpoint=False)
    ckpt = peak_bytes(blocks, x_host, upstream, use_checkpoint=True)
    print(f"peak memory, forward + backward of {n_blocks} blocks: "
          f"plain {plain / 2**20:.1f} MiB, checkpointed {ckpt / 2**20:.1f} MiB "
          f"(ratio {ckpt / plain:.2f})")
    assert ckpt < 0.5 * plain


def test_checkpoint_warns_when_no_input_requires_grad():
    # Then the block is not in the graph and its parameters would silently get
    # no gradient (the same limitation as torch's reentrant checkpoint).
    blocks = make_blocks(1, 3, "float64", 0)
    x = Tensor(randn(0, (2, 3)))
    with pytest.warns(UserWarning, match="no input requires grad"):
        out = checkpoint(lambda t: mlp_block(t, blocks[0], 0.0), x)
    assert out._ctx is None
    with minidist.no_grad():                   # inference: nothing to warn about
        checkpoint(lambda t: mlp_block(t, blocks[0], 0.0), x)


def test_activation_checkpoint_is_not_shadowed_by_the_checkpoint_package():
    """minidist.checkpoint is the save/load package; activation checkpointing
    stays reachable as minidist.autograd.checkpoint after both are imported."""
    import minidist.autograd
    import minidist.checkpoint as ckpt_package

    assert hasattr(ckpt_package, "save_checkpoint")
    assert callable(minidist.autograd.checkpoint)
