"""The parts of the Llama block, each against finite differences and PyTorch:
RMSNorm, rotary embeddings (and their relative-position property), SwiGLU, packed
documents (a packed row gives each document the logits it has alone)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.autograd import Tensor, gradcheck, ops
from minidist.nn import Llama, LlamaConfig, SwiGLU
from minidist.nn import functional as F
from minidist.nn.llama import positions_in_documents
from minidist.nn.rotary import apply_rotary, rotary_cos_sin
from oracles.optional import require

torch = require("torch")


def arr(a):
    return backend.from_host(np.asarray(a))


def leaf(a):
    return Tensor(arr(a), requires_grad=True)


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 5), c=st.integers(1, 9), seed=st.integers(0, 2**16),
       eps=st.sampled_from([1e-6, 1e-5, 0.1]))
def test_rms_norm_has_its_gradient_and_matches_torch(rows, c, seed, eps):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((rows, c)), rng.standard_normal(c)
    assert gradcheck(lambda a, b: ops.RMSNorm.apply(a, b, eps=eps), [leaf(x), leaf(w)])
    g = rng.standard_normal((rows, c))
    xt, wt = leaf(x), leaf(w)
    y = F.rms_norm(xt, c, wt, eps)
    y.backward(arr(g))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.rms_norm(tx, (c,), tw, eps)
    ty.backward(torch.tensor(g))
    for ours, theirs in ((y.data, ty), (xt.grad, tx.grad), (wt.grad, tw.grad)):
        np.testing.assert_allclose(backend.to_host(ours), theirs.detach().numpy(),
                                   rtol=1e-12, atol=1e-13)


def test_rms_norm_refuses_more_than_the_last_axis():
    with pytest.raises(ValueError, match="last axis only"):
        F.rms_norm(leaf(np.ones((2, 3))), (2, 3))


def _hf_rotary(x, positions, theta):
    """Hugging Face's rotate-half RoPE, written out in torch (float64)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.tensor(positions, dtype=torch.float64)[..., None] * inv
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    if cos.ndim == 3:
        cos, sin = cos[:, None], sin[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + half * sin


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), t=st.integers(1, 7), half=st.integers(1, 4),
       per_row=st.booleans(), theta=st.sampled_from([10000.0, 500000.0]),
       seed=st.integers(0, 2**16))
def test_rotary_matches_hugging_face_and_has_its_gradient(b, h, t, half, per_row, theta, seed):
    rng = np.random.default_rng(seed)
    d = 2 * half
    x = rng.standard_normal((b, h, t, d))
    positions = rng.integers(0, 50, (b, t) if per_row else (t,))
    cos, sin = rotary_cos_sin(arr(positions), d, theta, "float64")
    assert gradcheck(lambda a: apply_rotary(a, cos, sin), [leaf(x)])
    xt = leaf(x)
    y = apply_rotary(xt, cos, sin)
    g = rng.standard_normal(x.shape)
    y.backward(arr(g))
    tx = torch.tensor(x, requires_grad=True)
    ty = _hf_rotary(tx, positions, theta)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(backend.to_host(y.data), ty.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(backend.to_host(xt.grad), tx.grad.numpy(), rtol=0, atol=1e-12)


@given(m=st.integers(0, 300), n=st.integers(0, 300), shift=st.integers(0, 1000))
@settings(max_examples=20, deadline=None)
def test_rotary_scores_depend_only_on_relative_position(m, n, shift):
    """q_m . k_n = q_{m+s} . k_{n+s}: RoPE encodes n - m, not where the pair sits."""
    rng = np.random.default_rng(m * 1000 + n)
    q, k = rng.standard_normal((1, 1, 1, 16)), rng.standard_normal((1, 1, 1, 16))

    def score(i, j):
        cq = rotary_cos_sin(arr([i]), 16, 10000.0, "float64")
        ck = rotary_cos_sin(arr([j]), 16, 10000.0, "float64")
        a = apply_rotary(Tensor(arr(q)), *cq).data
        c = apply_rotary(Tensor(arr(k)), *ck).data
        return float(backend.to_host((a * c).sum()))

    assert abs(score(m, n) - score(m + shift, n + shift)) <= 1e-9 * (1 + abs(score(m, n)))


def test_rotary_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="even"):
        rotary_cos_sin(arr([0, 1]), 5)
    with pytest.raises(ValueError, match="even head_dim"):
        LlamaConfig(hidden_size=12, num_attention_heads=4, num_key_value_heads=4)


def test_swiglu_is_down_of_silu_gate_times_up():
    rng = np.random.default_rng(0)
    mlp = SwiGLU(6, 10, dtype="float64")
    x = rng.standard_normal((2, 3, 6))
    xt = leaf(x)
    y = mlp(xt)
    y.backward(arr(np.ones(y.shape)))
    tx = torch.tensor(x, requires_grad=True)
    w = {n: torch.tensor(backend.to_host(p.data)) for n, p in mlp.named_parameters()}
    lin = torch.nn.functional.linear
    ty = lin(torch.nn.functional.silu(lin(tx, w["gate_proj.weight"])) * lin(tx, w["up_proj.weight"]),
             w["down_proj.weight"])
    ty.sum().backward()
    np.testing.assert_allclose(backend.to_host(y.data), ty.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(backend.to_host(xt.grad), tx.grad.numpy(), rtol=1e-12)


def test_positions_restart_per_document():
    ids = arr([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    want = [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert backend.to_host(positions_in_documents(ids)).tolist() == want


@settings(max_examples=8, deadline=None)
@given(cuts=st.lists(st.integers(1, 11), min_size=1, max_size=3, unique=True),
       attention=st.sampled_from(["naive", "flash"]), kv=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 100))
def test_a_packed_row_gives_each_document_its_own_logits(cuts, attention, kv, seed):
    cfg = LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv, dtype="float64",
                      attention=attention, seed=seed)
    model = Llama(cfg)
    idx = np.random.default_rng(seed).integers(0, 20, (1, 12))
    bounds = [0] + sorted(cuts) + [12]
    ids = np.searchsorted(np.array(sorted(cuts)), np.arange(12), side="right")[None]
    packed = backend.to_host(model(arr(idx), document_ids=arr(ids))[0].data)
    for a, b in zip(bounds[:-1], bounds[1:]):
        alone = backend.to_host(model(arr(idx[:, a:b]))[0].data)
        assert np.abs(packed[:, a:b] - alone).max() <= 1e-12


def test_config_refuses_kv_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="num_key_value_heads=3 must divide"):
        LlamaConfig(num_attention_heads=4, num_key_value_heads=3)
