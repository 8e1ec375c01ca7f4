"""autocast: matmul-like ops see rounded inputs, write rounded outputs and
gradients, accumulate in float32; everything else stays float32. MasterWeights
keep a float32 copy that low-precision weights alone would lose updates of."""
from __future__ import annotations

import numpy as np
import pytest

from minidist import Tensor, backend
from minidist.nn import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.optim import SGD
from minidist.precision import BF16, FP16, MasterWeights, autocast, get_autocast_policy

from precision.helpers import quantize_host, same

rng = np.random.default_rng(0)
X = rng.standard_normal((4, 5, 8)).astype(np.float32)
W = rng.standard_normal((6, 8)).astype(np.float32)
B = rng.standard_normal(6).astype(np.float32)
G = (rng.standard_normal((4, 5, 6)) * 1e-6).astype(np.float32)   # small: fp16 subnormals


def representable(a, fmt) -> bool:
    a = backend.to_host(a)
    return same(quantize_host(a, fmt), a)


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=str)
def test_linear_rounds_inputs_output_and_gradients(fmt):
    x, w, b = (Tensor(backend.from_host(a), requires_grad=True) for a in (X, W, B))
    with autocast(fmt):
        y = F.linear(x, w, b)
    y.backward(backend.from_host(G))
    q = lambda a: quantize_host(np.asarray(a, np.float32), fmt)
    xq, wq, bq, gq = q(X), q(W), q(B), q(G)
    assert same(backend.to_host(y.data), q(xq.reshape(-1, 8) @ wq.T + bq).reshape(4, 5, 6))
    assert same(backend.to_host(x.grad), q(gq.reshape(-1, 6) @ wq).reshape(X.shape))
    assert same(backend.to_host(w.grad), q(gq.reshape(-1, 6).T @ xq.reshape(-1, 8)))
    assert same(backend.to_host(b.grad), q(gq.reshape(-1, 6).sum(0)))


def test_softmax_and_layer_norm_stay_float32():
    x = Tensor(backend.from_host(X))
    with autocast("bf16"):
        s = F.softmax(x)
        n = F.layer_norm(x)
    assert not representable(s.data, BF16) and not representable(n.data, BF16)
    assert same(backend.to_host(s.data), backend.to_host(F.softmax(x).data))


def test_attention_products_are_rounded():
    q, k, v = (Tensor(backend.from_host(rng.standard_normal((1, 2, 4, 8)).astype(np.float32)))
               for _ in range(3))
    with autocast("fp16"):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert representable(y.data, FP16)
    assert not same(backend.to_host(y.data),
                    backend.to_host(F.scaled_dot_product_attention(q, k, v, is_causal=True).data))


def test_autocast_nests_and_restores():
    assert get_autocast_policy() is None
    with autocast("fp16") as outer:
        with autocast(enabled=False):
            assert get_autocast_policy() is None
            y = F.linear(Tensor(backend.from_host(X)), Tensor(backend.from_host(W)))
            assert not representable(y.data, FP16)
        assert get_autocast_policy() is outer
    assert get_autocast_policy() is None


def test_gpt_under_bf16_is_close_to_float32():
    cfg = GPTConfig(block_size=16, vocab_size=20, n_layer=2, n_head=2, n_embd=32)
    idx = backend.from_host(rng.integers(0, 20, (2, 16)))
    tgt = backend.from_host(rng.integers(0, 20, (2, 16)))
    model = GPT(cfg)
    _, loss32 = model(idx, tgt)
    with autocast("bf16"):
        _, loss16 = model(idx, tgt)
    assert loss16.data.dtype == np.float32
    assert abs(loss16.item() - loss32.item()) < 2e-2 * loss32.item()
    assert loss16.item() != loss32.item()


def test_master_weights_keep_updates_too_small_for_fp16():
    w = Tensor(backend.from_host(np.ones(3, np.float32)), requires_grad=True)
    master = MasterWeights([w], "fp16")
    opt = SGD(master.params, lr=1.0)
    for _ in range(8):                        # 8 updates of 2^-13: each alone rounds away in fp16
        w.grad = backend.from_host(np.full(3, -2.0 ** -13, np.float32))
        master.grads_to_master()
        opt.step()
        master.master_to_model()
    assert backend.to_host(master.params[0].data).tolist() == [1 + 2.0 ** -10] * 3
    assert backend.to_host(w.data).tolist() == [1 + 2.0 ** -10] * 3
    assert representable(w.data, FP16)


def test_master_weights_round_gradients_and_weights():
    w = Tensor(backend.from_host(W.copy()), requires_grad=True)
    master = MasterWeights([w], "bf16")
    assert representable(w.data, BF16) and same(backend.to_host(master.params[0].data), W)
    w.grad = backend.from_host(np.array(W * 1e30))
    master.grads_to_master()
    assert representable(master.params[0].grad, BF16)
    with pytest.raises(TypeError, match="float32"):
        MasterWeights([Tensor(backend.from_host(np.ones(2, np.float16)))], "fp16")
