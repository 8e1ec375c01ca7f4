"""Flash attention equals naive attention, forward and backward, without the Lq x Lk matrix.

- float64: within 1e-10 of naive in the output and every gradient, over drawn
  shapes, block sizes, causal or not, masks and dropout;
- float32 and emulated bf16: its error against a float64 gold result is at most
  twice naive's own error in the same precision, plus a small floor (the rule
  FlashAttention's tests use);
- fully masked rows give zeros, tiles above the causal diagonal are never
  computed, and peak memory stays far below one score matrix.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.attention import flash, flash_attention, naive_attention
from minidist.autograd import Tensor, gradcheck
from minidist.nn import functional as F
from minidist.precision import BF16, autocast, quantize

from .cases import attention_case, make_inputs, run, run_torch


def blocks(case):
    return dict(block_q=case["block_q"], block_k=case["block_k"])


@settings(max_examples=60, deadline=None)
@given(case=attention_case())
def test_flash_equals_naive_in_float64(case):
    arrays, mask = make_inputs(case)
    want = run(naive_attention, arrays, mask, case)
    got = run(flash_attention, arrays, mask, case, **blocks(case))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert np.isfinite(g).all(), name
        assert np.abs(g - w).max(initial=0) <= 1e-10, name


@settings(max_examples=20, deadline=None)
@given(case=attention_case())
def test_flash_matches_torch_scaled_dot_product_attention(case):
    case["dropout"] = 0.0
    arrays, mask = make_inputs(case)
    got = run(flash_attention, arrays, mask, case, **blocks(case))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, run_torch(arrays, mask, case)):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11, err_msg=name)


def _errors(results, gold):
    return [np.abs(r.astype("float64") - g).max(initial=0) for r, g in zip(results, gold)]


@settings(max_examples=15, deadline=None)
@given(case=attention_case(masks=False, max_len=70))
def test_flash_float32_error_is_at_most_twice_naive_error(case):
    case["dropout"] = 0.0
    arrays, _ = make_inputs(case, dtype="float32")
    gold = run(naive_attention, [a.astype("float64") for a in arrays], None, case)
    naive_err = _errors(run(naive_attention, arrays, None, case), gold)
    flash_err = _errors(run(flash_attention, arrays, None, case, **blocks(case)), gold)
    # The floor scales with the largest gold value of the case, not of each array: a
    # gradient that is exactly zero (dK with one key: softmax is then constant, so naive
    # gets 0 exactly) still carries flash's rounding noise, of the size of its terms.
    scale = max(1.0, max(np.abs(g).max(initial=0) for g in gold))
    for name, fe, ne in zip(("out", "dq", "dk", "dv"), flash_err, naive_err):
        assert fe <= 2 * ne + 1e-6 * scale, f"{name}: flash {fe:.2e}, naive {ne:.2e}"


def _bf16(a):
    return backend.to_host(quantize(backend.from_host(a), BF16))


@settings(max_examples=10, deadline=None)
@given(case=attention_case(masks=False, max_len=70))
def test_flash_bf16_error_is_at_most_twice_naive_error(case):
    """Under autocast("bf16"): naive is nn.functional's textbook attention (both products
    in bf16), gold is float64 on the same bf16-rounded inputs and upstream gradient."""
    case["dropout"] = 0.0
    arrays, _ = make_inputs(case, dtype="float32")
    gold = run(naive_attention, [_bf16(a).astype("float64") for a in arrays], None, case)

    def textbook(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, generator=None):
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    with autocast("bf16"):
        naive_err = _errors(run(textbook, arrays, None, case), gold)
        flash_err = _errors(run(flash_attention, arrays, None, case, **blocks(case)), gold)
    scale = max(1.0, max(np.abs(g).max(initial=0) for g in gold))  # as in the float32 test
    for name, fe, ne in zip(("out", "dq", "dk", "dv"), flash_err, naive_err):
        floor = 1e-4 * scale                                   # bf16's eps is 2^-8
        assert fe <= 2 * ne + floor, f"{name}: flash {fe:.2e}, naive {ne:.2e}"


@pytest.mark.parametrize("causal", [False, True])
def test_flash_gradients_match_central_differences(causal):
    case = dict(lead=(2,), lq=5, lk=6, e=3, ev=2, mask=None, seed=3)
    (q, k, v, _), _ = make_inputs(case)

    def fn(a, b, c):
        return flash_attention(a, b, c, is_causal=causal, dropout_p=0.3, block_q=2, block_k=4,
                               generator=backend.Generator(5))
    assert gradcheck(fn, [Tensor(backend.from_host(x), requires_grad=True) for x in (q, k, v)])


def test_fully_masked_rows_give_zeros_not_nan():
    case = dict(lead=(2,), lq=9, lk=7, e=4, ev=3, mask=None, seed=1, dropout=0.0, causal=False)
    arrays, _ = make_inputs(case)
    mask = np.ones((9, 7), dtype=bool)
    mask[[0, 4, 8]] = False                                    # rows in several tiles
    out, dq, dk, dv = run(flash_attention, arrays, mask, case, block_q=4, block_k=3)
    assert np.all(out[:, [0, 4, 8]] == 0) and np.all(dq[:, [0, 4, 8]] == 0)
    assert np.isfinite(out).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


def test_rows_beyond_the_keys_see_them_all_when_lq_exceeds_lk():
    case = dict(lead=(), lq=11, lk=4, e=3, ev=2, mask=None, seed=2, dropout=0.0, causal=True)
    arrays, _ = make_inputs(case)
    want = run(naive_attention, arrays, None, case)
    got = run(flash_attention, arrays, None, case, block_q=3, block_k=2)
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 1e-12


@given(lq=st.integers(1, 50), lk=st.integers(1, 50), bq=st.integers(1, 16),
       bk=st.integers(1, 16))
@settings(max_examples=30, deadline=None)
def test_causal_tiles_above_the_diagonal_are_skipped(lq, lk, bq, bk):
    """Every computed tile has a key j <= i for some row i (forward and backward),
    and every (row, key) pair on or below the diagonal is covered exactly once each way."""
    seen = []
    original = flash._tile_scores

    def spy(q_i, k_t, scale, lead, mask, structure, i0, j0):
        seen.append((i0, q_i.shape[-2], j0, k_t.shape[-1]))
        return original(q_i, k_t, scale, lead, mask, structure, i0, j0)

    q, k, v = (backend.from_host(np.ones((1, n, 2))) for n in (lq, lk, lk))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flash, "_tile_scores", spy)
        o, lse = flash.flash_forward(q, k, v, is_causal=True, block_q=bq, block_k=bk)
        flash.flash_backward(q, k, v, o, lse, o, is_causal=True, block_q=bq, block_k=bk)
    cover = np.zeros((lq, lk), dtype=int)
    for i0, rows, j0, cols in seen:
        assert j0 <= i0 + rows - 1, "a tile above the diagonal was computed"
        cover[i0:i0 + rows, j0:j0 + cols] += 1
    below = np.tril(np.ones((lq, lk), dtype=bool))
    assert np.all(cover[below] == 2)


def test_flash_never_holds_a_score_matrix():
    """Peak extra memory of forward + backward at s = 2048 is below 1/16 of one s x s matrix."""
    s, d = 2048, 8
    rng = np.random.default_rng(0)
    q, k, v, do = (backend.from_host(rng.standard_normal((1, s, d))) for _ in range(4))
    with backend.MemoryTracker() as mem:
        qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
        flash_attention(qt, kt, vt, is_causal=True, block_q=128, block_k=128).backward(do)
    assert mem.peak < s * s * 8 / 16


@settings(max_examples=8, deadline=None)
@given(case=attention_case(masks=False))
def test_flash_dropout_keeps_the_same_entries_as_naive(case):
    """Same generator seed, same dropped entries, whatever the tiling."""
    case["dropout"] = 0.5
    arrays, _ = make_inputs(case)
    want = run(naive_attention, arrays, None, case)
    got = run(flash_attention, arrays, None, case, **blocks(case))
    assert np.abs(got[0] - want[0]).max() <= 1e-10


def test_gpt_with_flash_attention_equals_gpt_with_naive_attention():
    from minidist.nn import GPT, GPTConfig
    rng = np.random.default_rng(0)
    idx = backend.from_host(rng.integers(0, 11, (2, 12)))
    results = []
    for attention in ("naive", "flash"):
        model = GPT(GPTConfig(block_size=12, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                              dtype="float64", attention=attention))
        _, loss = model(idx, idx)
        loss.backward()
        results.append([backend.to_host(p.grad) for p in model.parameters()] + [loss.item()])
    for g, w in zip(*results):
        assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-12


def test_bad_block_sizes_are_refused():
    q = Tensor(backend.from_host(np.zeros((3, 2))))
    with pytest.raises(ValueError, match="block_q"):
        flash_attention(q, q, q, block_q=0)
    with pytest.raises(ValueError, match="attention must be"):
        from minidist.nn import GPT, GPTConfig
        GPT(GPTConfig(attention="fast"))


def test_default_tiles_are_the_backends_and_used_when_none_are_given(monkeypatch):
    """512-row tiles on the CPU backends, 1024 on CuPy (fewer kernel launches); a call
    without block sizes runs exactly as one that names the default tiles."""
    expected = (flash.GPU_BLOCK,) * 2 if backend.get_backend() == "cupy" else \
        (flash.BLOCK_Q, flash.BLOCK_K)
    assert flash.default_tiles() == expected
    seen, real = [], flash.flash_forward

    def spy(*args, **kwargs):
        seen.append((kwargs["block_q"], kwargs["block_k"]))
        return real(*args, **kwargs)
    monkeypatch.setattr(flash, "flash_forward", spy)
    q = Tensor(backend.from_host(np.random.default_rng(0).standard_normal((1, 5, 4))))
    flash_attention(q, q, q, is_causal=True)
    assert seen == [expected]
