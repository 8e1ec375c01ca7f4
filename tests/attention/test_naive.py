"""Naive attention: PyTorch's scaled_dot_product_attention semantics, one fused op.

Checked against central differences, against PyTorch when it is installed, and
on the edge cases PyTorch defines (fully masked rows, top-left causal alignment,
dropout's 1/(1-p) rescaling).
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings

from minidist import backend
from minidist.attention import naive_attention
from minidist.autograd import Tensor, gradcheck

from .cases import attention_case, make_inputs, run, run_torch


def tensors(*arrays):
    return [Tensor(backend.from_host(a), requires_grad=True) for a in arrays]


@pytest.mark.parametrize("causal, mask", [(False, None), (True, None), (False, "bool"),
                                          (False, "float")])
def test_naive_gradients_match_central_differences(causal, mask):
    case = dict(lead=(2,), lq=4, lk=5, e=3, ev=2, causal=causal, mask=mask, dropout=0.0,
                seed=1)
    (q, k, v, _), m = make_inputs(case)
    mask_arr = None if m is None else backend.from_host(m)
    assert gradcheck(lambda a, b, c: naive_attention(a, b, c, attn_mask=mask_arr,
                                                     is_causal=causal), tensors(q, k, v))


def test_naive_gradients_with_dropout_match_central_differences():
    """The same seed drops the same entries in every call, so the op is deterministic."""
    (q, k, v, _), _ = make_inputs(dict(lead=(2,), lq=4, lk=6, e=3, ev=2, mask=None, seed=2))
    fn = lambda a, b, c: naive_attention(a, b, c, dropout_p=0.4,  # noqa: E731
                                         generator=backend.Generator(7))
    assert gradcheck(fn, tensors(q, k, v))


@settings(max_examples=40, deadline=None)
@given(case=attention_case())
def test_naive_matches_torch_scaled_dot_product_attention(case):
    case["dropout"] = 0.0
    arrays, mask = make_inputs(case)
    got = run(naive_attention, arrays, mask, case)
    want = run_torch(arrays, mask, case)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-11, err_msg=name)


def test_a_fully_masked_row_gives_zeros_not_nan():
    (q, k, v, do), _ = make_inputs(dict(lead=(), lq=3, lk=4, e=2, ev=2, mask=None, seed=0))
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    case = dict(dropout=0.0, causal=False, seed=0)
    out, dq, dk, dv = run(naive_attention, [q, k, v, do], mask, case)
    assert np.all(out[1] == 0) and np.all(dq[1] == 0)
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


def test_causal_mask_is_aligned_top_left_when_lengths_differ():
    """Row i sees keys 0..i, whatever Lk: row 0 of a 2 x 5 problem sees only key 0."""
    q = np.zeros((2, 1))
    k = np.zeros((5, 1))
    v = np.arange(5.0)[:, None]
    out = naive_attention(*tensors(q, k, v), is_causal=True)
    assert np.allclose(backend.to_host(out.data)[:, 0], [0.0, 0.5])


def test_dropout_rescales_kept_weights_by_one_over_one_minus_p():
    """With uniform weights 1/Lk and V = 1, each output is (kept / Lk) / (1 - p):
    its mean over many rows is close to 1, and every value is a multiple of
    1 / (Lk (1 - p))."""
    lq, lk, p = 2000, 50, 0.25
    q, k, v = np.zeros((lq, 4)), np.zeros((lk, 4)), np.ones((lk, 1))
    out = backend.to_host(naive_attention(*tensors(q, k, v), dropout_p=p,
                                          generator=backend.Generator(3)).data)
    kept = out[:, 0] * lk * (1 - p)
    assert np.allclose(kept, np.round(kept))
    assert abs(out.mean() - 1.0) < 0.01


def test_the_default_scale_is_one_over_sqrt_head_dim():
    (q, k, v, _), _ = make_inputs(dict(lead=(2,), lq=3, lk=4, e=9, ev=2, mask=None, seed=4))
    default = naive_attention(*tensors(q, k, v)).data
    explicit = naive_attention(*tensors(q, k, v), scale=1 / math.sqrt(9)).data
    other = naive_attention(*tensors(q, k, v), scale=0.5).data
    assert np.array_equal(backend.to_host(default), backend.to_host(explicit))
    assert not np.allclose(backend.to_host(default), backend.to_host(other))


@pytest.mark.parametrize("shapes, error", [
    (((2, 3, 4), (2, 3, 5), (2, 3, 4)), ValueError),   # head dims of q and k differ
    (((2, 3, 4), (2, 5, 4), (2, 4, 4)), ValueError),   # key and value lengths differ
    (((2, 3, 4), (3, 5, 4), (3, 5, 4)), ValueError),   # batch dims differ
    (((4,), (5, 4), (5, 4)), ValueError),              # query is 1-D
])
def test_bad_shapes_are_refused(shapes, error):
    arrays = [np.zeros(s) for s in shapes]
    with pytest.raises(error):
        naive_attention(*tensors(*arrays))


def test_bad_options_are_refused():
    q, k, v = tensors(np.zeros((3, 2)), np.zeros((4, 2)), np.zeros((4, 2)))
    mask = backend.from_host(np.ones((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="not both"):
        naive_attention(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(ValueError, match="dropout_p"):
        naive_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="broadcast"):
        naive_attention(q, k, v, attn_mask=backend.from_host(np.ones((3, 5), dtype=bool)))
    with pytest.raises(TypeError, match="dtype"):
        naive_attention(q, k, v, attn_mask=backend.from_host(np.ones((3, 4), dtype="float32")))
    with pytest.raises(TypeError, match="dtype"):
        naive_attention(q, k, Tensor(backend.from_host(np.zeros((4, 2), dtype="float32"))))
    with pytest.raises(ValueError, match="requires grad"):
        naive_attention(q, k, v, attn_mask=Tensor(backend.from_host(np.zeros((3, 4))),
                                                  requires_grad=True))
