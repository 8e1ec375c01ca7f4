"""LARS against its published rule (You et al. 2017), written out below in NumPy."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.optim import LARS, lars_update
from optim_helpers import (PROPERTY, assert_weights_close, make_params, make_problem,
                           run_minidist, seeds, shape_lists, steps)


def lars_reference(w, grads, lr, momentum, weight_decay, trust_coefficient):
    """The paper's Algorithm 1 for one layer, plainly, in float64."""
    v = np.zeros_like(w)
    for g in grads:
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        if w_norm > 0 and g_norm > 0:
            local_lr = trust_coefficient * w_norm / (g_norm + weight_decay * w_norm)
        else:
            local_lr = 1.0
        v = momentum * v + lr * local_lr * (g + weight_decay * w)
        w = w - v
    return w


@st.composite
def lars_settings(draw):
    return dict(lr=draw(st.floats(0.1, 10.0)), momentum=draw(st.sampled_from([0.0, 0.9])),
                weight_decay=draw(st.sampled_from([0.0, 5e-4, 0.1])),
                trust_coefficient=draw(st.sampled_from([1e-3, 2e-2])))


@PROPERTY
@given(shapes=shape_lists, n_steps=steps, seed=seeds, hyper=lars_settings())
def test_lars_matches_published_rule_over_steps(shapes, n_steps, seed, hyper):
    weights, grads = make_problem(shapes, n_steps, seed)
    ours = run_minidist(lambda ps: LARS(ps, **hyper), weights, grads)
    reference = [lars_reference(w, [round_[i] for round_ in grads], **hyper)
                 for i, w in enumerate(weights)]
    assert_weights_close(ours, reference, "float64")


@PROPERTY
@given(seed=seeds, scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_lars_step_is_a_fixed_fraction_of_the_weight_norm(seed, scale):
    # No momentum, no decay: the step is lr * c * ||w|| / ||g|| * g, of length lr * c * ||w||,
    # whatever the gradient's scale.
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=(4, 3))
    w = backend.from_host(w0.copy())
    g = backend.from_host(scale * rng.normal(size=(4, 3)))
    buf = backend.from_host(np.zeros((4, 3)))
    local_lr = lars_update(w, g, buf, lr=2.0, momentum=0.0, trust_coefficient=1e-3)
    np.testing.assert_allclose(np.linalg.norm(backend.to_host(w) - w0),
                               2.0 * 1e-3 * np.linalg.norm(w0), rtol=1e-10)
    assert local_lr > 0


def test_lars_zero_gradient_uses_local_lr_one():
    w = backend.from_host(np.ones(2))
    g = backend.from_host(np.zeros(2))
    buf = backend.from_host(np.zeros(2))
    assert lars_update(w, g, buf, lr=1.0, weight_decay=0.0) == 1.0
    np.testing.assert_array_equal(backend.to_host(w), [1.0, 1.0])


@pytest.mark.parametrize("bad", [dict(lr=-1.0), dict(momentum=-0.5), dict(weight_decay=-1.0),
                                 dict(trust_coefficient=0.0)])
def test_lars_rejects_bad_hyperparameters(bad):
    with pytest.raises(ValueError):
        LARS(make_params([np.zeros(2)]), **bad)
