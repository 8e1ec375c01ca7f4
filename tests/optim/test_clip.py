"""clip_grad_norm_ against torch.nn.utils.clip_grad_norm_, and the sharded composition."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.optim import clip_grad_norm_, clip_grads_with_norm_, grad_norm, grad_sq_sum
from optim_helpers import PROPERTY, make_params, make_problem, seeds, set_grads, shape_lists

def grads_host(params):
    return [None if p.grad is None else backend.to_host(p.grad).copy() for p in params]


@PROPERTY
@given(shapes=shape_lists, seed=seeds, norm_type=st.sampled_from([2.0, 1.0, 3.0, math.inf]),
       max_norm=st.sampled_from([1e-2, 1.0, 1e3]), drop_first=st.booleans())
def test_clip_grad_norm_matches_torch(shapes, seed, norm_type, max_norm, drop_first, torch):
    weights, (grads,) = make_problem(shapes, 1, seed)
    params = make_params(weights)
    set_grads(params, grads)
    theirs = [torch.tensor(w, requires_grad=True) for w in weights]
    for p, g in zip(theirs, grads):
        p.grad = torch.tensor(g)
    if drop_first:                       # a parameter without a gradient is skipped
        params[0].grad = None
        theirs[0].grad = None
    total = clip_grad_norm_(params, max_norm, norm_type)
    total_torch = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert isinstance(total, float)
    np.testing.assert_allclose(total, total_torch.item(), rtol=1e-12)
    for ours, p in zip(grads_host(params), theirs):
        if p.grad is None:
            assert ours is None
        else:
            np.testing.assert_allclose(ours, p.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_clipped_gradients_have_norm_max_norm():
    params = make_params([np.zeros(4)])
    set_grads(params, [np.array([3.0, 4.0, 0.0, 0.0])])     # norm 5
    assert clip_grad_norm_(params, 1.0) == 5.0
    np.testing.assert_allclose(np.linalg.norm(backend.to_host(params[0].grad)), 1.0, rtol=1e-6)


def test_small_gradients_are_left_alone():
    params = make_params([np.zeros(2)])
    set_grads(params, [np.array([0.3, 0.4])])
    clip_grad_norm_(params, 1.0)
    np.testing.assert_array_equal(backend.to_host(params[0].grad), [0.3, 0.4])


@PROPERTY
@given(shapes=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=2, max_size=5),
       seed=seeds, split=st.integers(1, 4))
def test_clip_across_shards_equals_clip_of_the_whole(shapes, seed, split):
    # Two "ranks" each hold some parameters. sqrt(sum of their grad_sq_sum) is the
    # total norm (what an all-reduce would give), and clipping each rank's shard with
    # it gives exactly what clipping everything at once gives.
    weights, (grads,) = make_problem(shapes, 1, seed)
    split = min(split, len(shapes) - 1)
    whole = make_params(weights)
    set_grads(whole, grads)
    sharded = make_params(weights)
    set_grads(sharded, grads)
    rank0, rank1 = sharded[:split], sharded[split:]
    total = math.sqrt(grad_sq_sum(rank0) + grad_sq_sum(rank1))
    # for the inf-norm the ranks would all-reduce a max instead: exact
    inf_total = max(grad_norm([p.grad for p in rank0], math.inf),
                    grad_norm([p.grad for p in rank1], math.inf))
    assert inf_total == grad_norm([p.grad for p in whole], math.inf)
    expected = clip_grad_norm_(whole, 0.5)
    np.testing.assert_allclose(total, expected, rtol=1e-12)
    clip_grads_with_norm_(rank0, 0.5, total)
    clip_grads_with_norm_(rank1, 0.5, total)
    for a, b in zip(grads_host(sharded), grads_host(whole)):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_no_gradients_gives_norm_zero():
    assert clip_grad_norm_(make_params([np.ones(3)]), 1.0) == 0.0
    assert grad_sq_sum(make_params([np.ones(3)])) == 0.0


def test_nonfinite_norm_raises_when_asked():
    params = make_params([np.zeros(2)])
    set_grads(params, [np.array([np.nan, 1.0])])
    with pytest.raises(RuntimeError, match="nan"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)


def test_bad_arguments_raise():
    params = make_params([np.zeros(2)])
    set_grads(params, [np.ones(2)])
    with pytest.raises(ValueError):
        clip_grad_norm_(params, -1.0)
    with pytest.raises(ValueError):
        clip_grad_norm_(params, 1.0, norm_type=0.0)
    with pytest.raises(TypeError):
        clip_grad_norm_([np.ones(2)], 1.0)
