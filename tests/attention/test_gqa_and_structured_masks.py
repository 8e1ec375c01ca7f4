"""Grouped-query heads, sliding windows and packed documents, in naive and flash attention.

The oracle is PyTorch's scaled_dot_product_attention with ``enable_gqa=True`` and the
whole boolean (L, L) mask written out densely; flash must equal naive to 1e-10 in
float64 with every tile size, and never make the repeated K / V.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.attention import flash, flash_attention, naive_attention
from minidist.autograd import Tensor
from oracles.optional import require

torch = require("torch")


@st.composite
def gqa_case(draw):
    hkv = draw(st.integers(1, 3))
    case = dict(batch=draw(st.integers(1, 2)), hkv=hkv, g=draw(st.integers(1, 3)),
                length=draw(st.integers(1, 24)), e=draw(st.integers(1, 6)),
                causal=draw(st.booleans()), window=None, docs=None,
                block_q=draw(st.integers(1, 9)), block_k=draw(st.integers(1, 9)),
                seed=draw(st.integers(0, 2**20)))
    if case["causal"]:
        case["window"] = draw(st.sampled_from([None, 1, 2, 5, 30]))
    if draw(st.booleans()):      # document boundaries: sorted ids per batch row
        cuts = draw(st.lists(st.integers(0, case["length"]), max_size=3))
        case["docs"] = [sorted(cuts)] * case["batch"] if draw(st.booleans()) else [sorted(cuts)]
    return case


def _inputs(case):
    rng = np.random.default_rng(case["seed"])
    b, hkv, hq, n, e = case["batch"], case["hkv"], case["hkv"] * case["g"], case["length"], case["e"]
    q = rng.standard_normal((b, hq, n, e))
    k = rng.standard_normal((b, hkv, n, e))
    v = rng.standard_normal((b, hkv, n, e))
    do = rng.standard_normal((b, hq, n, e))
    ids = None
    if case["docs"] is not None:
        ids = np.stack([np.searchsorted(np.array(cuts), np.arange(n), side="right")
                        for cuts in case["docs"]]).astype(np.int64)    # (B or 1, n)
    return q, k, v, do, ids


def _dense_mask(case, ids):
    """The (B or 1, 1, n, n) boolean mask (True = attend) the options stand for."""
    n = case["length"]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = np.ones((n, n), dtype=bool)
    if case["causal"]:
        keep &= j <= i
    if case["window"] is not None:
        keep &= i - j < case["window"]
    keep = keep[None, None]
    if ids is not None:
        keep = keep & (ids[:, None, :, None] == ids[:, None, None, :])
    return keep


def _torch(q, k, v, do, keep):
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=torch.tensor(keep), enable_gqa=True)
    out = torch.nan_to_num(out)        # a row that sees no key: 0 here, NaN in PyTorch
    out.backward(torch.tensor(do))
    return [t.detach().numpy() for t in (out, qt.grad, kt.grad, vt.grad)]


def _ours(op, q, k, v, do, ids, case, **options):
    qt, kt, vt = (Tensor(backend.from_host(a), requires_grad=True) for a in (q, k, v))
    out = op(qt, kt, vt, is_causal=case["causal"], enable_gqa=True, window=case["window"],
             document_ids=None if ids is None else backend.from_host(ids), **options)
    out.backward(backend.from_host(do))
    return [backend.to_host(a) for a in (out.data, qt.grad, kt.grad, vt.grad)]


@settings(max_examples=40, deadline=None)
@given(case=gqa_case())
def test_naive_and_flash_match_torch_with_gqa_windows_and_documents(case):
    q, k, v, do, ids = _inputs(case)
    keep = _dense_mask(case, ids)
    if not keep.any(axis=-1).all():
        # PyTorch's gradient through a row with no key is NaN; ours is 0
        return
    want = _torch(q, k, v, do, keep)
    naive = _ours(naive_attention, q, k, v, do, ids, case)
    tiled = _ours(flash_attention, q, k, v, do, ids, case, block_q=case["block_q"],
                  block_k=case["block_k"])
    for name, w, a, b in zip(("out", "dq", "dk", "dv"), want, naive, tiled):
        np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-11, err_msg=f"naive {name}")
        assert np.abs(b - a).max(initial=0) <= 1e-10, f"flash {name}"


@settings(max_examples=25, deadline=None)
@given(case=gqa_case())
def test_rows_with_no_key_give_zeros_in_both(case):
    """Documents and windows can leave a row with nothing: O = 0 and gradients 0, no NaN."""
    q, k, v, do, ids = _inputs(case)
    naive = _ours(naive_attention, q, k, v, do, ids, case)
    tiled = _ours(flash_attention, q, k, v, do, ids, case, block_q=case["block_q"],
                  block_k=case["block_k"])
    for a, b in zip(naive, tiled):
        assert np.isfinite(a).all() and np.isfinite(b).all()
        assert np.abs(a - b).max(initial=0) <= 1e-10


@given(n=st.integers(1, 40), window=st.integers(1, 12), bq=st.integers(1, 8),
       bk=st.integers(1, 8))
@settings(max_examples=30, deadline=None)
def test_tiles_outside_the_window_are_skipped(n, window, bq, bk):
    """Each computed tile holds a pair (i, j) with 0 <= i - j < window, and every such
    pair is computed exactly once in forward and once in backward."""
    seen = []
    original = flash._tile_scores

    def spy(q_i, k_t, scale, lead, mask, structure, i0, j0):
        seen.append((i0, q_i.shape[-2], j0, k_t.shape[-1]))
        return original(q_i, k_t, scale, lead, mask, structure, i0, j0)

    from minidist.attention.common import Structure
    q = backend.from_host(np.ones((1, n, 2)))
    structure = Structure(True, window)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flash, "_tile_scores", spy)
        o, lse = flash.flash_forward(q, q, q, block_q=bq, block_k=bk, structure=structure)
        flash.flash_backward(q, q, q, o, lse, o, block_q=bq, block_k=bk, structure=structure)
    cover = np.zeros((n, n), dtype=int)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    inside = (j <= i) & (i - j < window)
    for i0, rows, j0, cols in seen:
        assert inside[i0:i0 + rows, j0:j0 + cols].any(), "a tile outside the window was computed"
        cover[i0:i0 + rows, j0:j0 + cols] += 1
    assert np.all(cover[inside] == 2)


@given(n=st.integers(2, 30), data=st.data())
@settings(max_examples=30, deadline=None)
def test_a_shifted_structure_masks_a_block_by_its_global_positions(n, data):
    """Queries [q0, q0 + lq) against keys [k0, k0 + lk) of one sequence, as ring attention
    scores them: Structure(shift = q0 - k0) gives naive attention with the rows and
    columns of the whole sequence's mask, forward and backward, and flash computes
    only tiles that reach a pair inside the diagonal and the window (documents are masked,
    not skipped), each such pair once in forward and once in backward."""
    from minidist.attention.common import Structure
    q0, k0 = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
    lq, lk = data.draw(st.integers(1, n - q0)), data.draw(st.integers(1, n - k0))
    window = data.draw(st.sampled_from([None, 1, 2, 5, 40]))
    cuts = sorted(data.draw(st.lists(st.integers(1, n - 1), max_size=3)))
    ids = np.searchsorted(np.array(cuts, dtype=np.int64), np.arange(n), side="right")[None]
    bq, bk = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    reach = (j <= i) if window is None else (j <= i) & (i - j < window)
    reach = reach[q0:q0 + lq, k0:k0 + lk]
    keep = reach & (ids[0][q0:q0 + lq, None] == ids[0][None, k0:k0 + lk])
    rng = np.random.default_rng(n)
    q, do = rng.standard_normal((2, 1, 2, lq, 3))
    k, v = rng.standard_normal((2, 1, 2, lk, 3))
    docs = tuple(backend.from_host(ids[:, a:a + m]) for a, m in ((q0, lq), (k0, lk)))
    structure = Structure(True, window, docs, shift=q0 - k0)

    seen = []
    original = flash._tile_scores

    def spy(q_i, k_t, scale, lead, mask, structure, i0, j0):
        seen.append((i0, q_i.shape[-2], j0, k_t.shape[-1]))
        return original(q_i, k_t, scale, lead, mask, structure, i0, j0)

    q_, k_, v_, do_ = (backend.from_host(a) for a in (q, k, v, do))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flash, "_tile_scores", spy)
        o, lse = flash.flash_forward(q_, k_, v_, block_q=bq, block_k=bk, structure=structure,
                                     scale=3 ** -0.5)
        grads = flash.flash_backward(q_, k_, v_, o, lse, do_, block_q=bq, block_k=bk,
                                     structure=structure, scale=3 ** -0.5)
    cover = np.zeros(keep.shape, dtype=int)
    for i0, rows, j0, cols in seen:
        assert reach[i0:i0 + rows, j0:j0 + cols].any(), "a tile outside the window was computed"
        cover[i0:i0 + rows, j0:j0 + cols] += 1
    assert np.all(cover[reach] == 2)

    qt, kt, vt = (Tensor(backend.from_host(a), requires_grad=True) for a in (q, k, v))
    out = naive_attention(qt, kt, vt, attn_mask=backend.from_host(keep))
    out.backward(do_)
    for got, want in zip((o,) + tuple(grads), (out.data, qt.grad, kt.grad, vt.grad)):
        assert np.abs(backend.to_host(got) - backend.to_host(want)).max() <= 1e-12


def test_flash_gqa_never_repeats_k_and_v():
    """No array of the query's head count times Lk x E is made: the matmuls broadcast."""
    b, hkv, g, n, e = 1, 2, 4, 64, 8
    rng = np.random.default_rng(0)
    q = backend.from_host(rng.standard_normal((b, hkv * g, n, e)))
    k = backend.from_host(rng.standard_normal((b, hkv, n, e)))
    shapes = []
    original = backend.xp.matmul

    def spy(a, c, *args, **kw):
        shapes.append((a.shape, c.shape))
        return original(a, c, *args, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flash.xp, "matmul", spy)
        o, lse = flash.flash_forward(q, k, k, is_causal=True, block_q=16, block_k=16)
        flash.flash_backward(q, k, k, o, lse, o, is_causal=True, block_q=16, block_k=16)
    assert shapes
    repeated = {(hkv, g, n, e), (hkv, g, e, n)}       # K or V (or K^T) of every query head
    for a, c in shapes:
        assert a not in repeated and c not in repeated, (a, c)
    assert any(c == (hkv, 1, e, 16) for _, c in shapes)   # K^T tiles: one head per group


@pytest.mark.parametrize("kwargs, message", [
    (dict(window=0, is_causal=True), "window must be a positive int"),
    (dict(window=3), "needs is_causal=True"),
    (dict(document_ids=np.zeros((3, 5), dtype=np.int64)), "document_ids must be"),
    (dict(document_ids=np.zeros(5)), "integer array"),
])
def test_bad_window_or_documents_are_refused(kwargs, message):
    q = Tensor(backend.from_host(np.ones((2, 4, 5, 3))))
    if "document_ids" in kwargs:
        kwargs["document_ids"] = backend.from_host(kwargs["document_ids"])
    for op in (naive_attention, flash_attention):
        with pytest.raises((ValueError, TypeError), match=message):
            op(q, q, q, **kwargs)


def test_gqa_heads_must_divide():
    q = Tensor(backend.from_host(np.ones((1, 6, 5, 3))))
    k = Tensor(backend.from_host(np.ones((1, 4, 5, 3))))
    with pytest.raises(ValueError, match="Hkv dividing the query heads"):
        flash_attention(q, k, k, enable_gqa=True)
    with pytest.raises(ValueError, match="leading"):
        naive_attention(q, k, k)       # without the flag, as PyTorch


def test_flash_gqa_peak_memory_is_below_repeated_kv_by_their_copies():
    """Forward + backward with 2 kv heads for 8 query heads holds less, by at least the
    repeated K and V and their gradients, than with K/V repeated to 8 heads first."""
    h, kv, n, e = 8, 2, 256, 16
    rng = np.random.default_rng(0)
    q, do = (backend.from_host(rng.standard_normal((1, h, n, e))) for _ in range(2))
    k, v = (backend.from_host(rng.standard_normal((1, kv, n, e))) for _ in range(2))

    def peak(repeat):
        with backend.MemoryTracker() as mem:
            keys, values = k, v
            if repeat:
                keys, values = (backend.xp.repeat(a, h // kv, axis=1) for a in (k, v))
            qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, keys, values))
            flash_attention(qt, kt, vt, is_causal=True, enable_gqa=not repeat, block_q=64,
                            block_k=64).backward(do)
        return mem.peak

    copies = 2 * 2 * (h - kv) * n * e * 8        # K, V and dK, dV at h - kv more heads
    assert peak(False) <= peak(True) - copies
