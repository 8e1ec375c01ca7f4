"""LAMB against its published rule (You et al. 2019), written out below in NumPy."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.optim import LAMB, lamb_update, trust_ratio
from optim_helpers import (PROPERTY, assert_weights_close, make_params, make_problem,
                           run_minidist, seeds, shape_lists, steps)


def lamb_reference(w, grads, lr, beta1, beta2, eps, weight_decay):
    """The paper's Algorithm 2 for one layer, plainly, in float64."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat = m / (1 - beta1 ** t)
        v_hat = v / (1 - beta2 ** t)
        u = m_hat / (np.sqrt(v_hat) + eps) + weight_decay * w
        w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
        r = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        w = w - lr * r * u
    return w


@st.composite
def lamb_settings(draw):
    return dict(lr=draw(st.floats(1e-4, 0.1)),
                betas=(draw(st.sampled_from([0.5, 0.9])), draw(st.sampled_from([0.99, 0.999]))),
                eps=draw(st.sampled_from([1e-6, 1e-3])),
                weight_decay=draw(st.sampled_from([0.0, 0.01, 0.1])))


@PROPERTY
@given(shapes=shape_lists, n_steps=steps, seed=seeds, hyper=lamb_settings())
def test_lamb_matches_published_rule_over_steps(shapes, n_steps, seed, hyper):
    weights, grads = make_problem(shapes, n_steps, seed)
    ours = run_minidist(lambda ps: LAMB(ps, **hyper), weights, grads)
    beta1, beta2 = hyper["betas"]
    reference = [lamb_reference(w, [round_[i] for round_ in grads], hyper["lr"], beta1, beta2,
                                hyper["eps"], hyper["weight_decay"])
                 for i, w in enumerate(weights)]
    assert_weights_close(ours, reference, "float64")


@PROPERTY
@given(shape=st.sampled_from([(5,), (3, 4), (2, 2, 2)]), seed=seeds,
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_lamb_step_length_is_lr_times_weight_norm(shape, seed, scale):
    # With r = ||w|| / ||u||, the step is lr * r * u, so ||w_new - w|| = lr * ||w||,
    # whatever the scale of the gradient: the point of the trust ratio.
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=shape)
    w = backend.from_host(w0.copy())
    g = backend.from_host(scale * rng.normal(size=shape))
    m, v = backend.from_host(np.zeros(shape)), backend.from_host(np.zeros(shape))
    lamb_update(w, g, m, v, 1, lr=0.01, weight_decay=0.01)
    step = np.linalg.norm(backend.to_host(w) - w0)
    np.testing.assert_allclose(step, 0.01 * np.linalg.norm(w0), rtol=1e-10)


def test_lamb_zero_weights_take_the_unscaled_step():
    # ||w|| = 0 (a zero-initialised bias): r = 1, so the step is lr * u, not 0 forever.
    w = backend.from_host(np.zeros(3))
    g = backend.from_host(np.array([1.0, -2.0, 4.0]))
    m, v = backend.from_host(np.zeros(3)), backend.from_host(np.zeros(3))
    ratio = lamb_update(w, g, m, v, 1, lr=0.1, eps=0.0)
    assert ratio == 1.0
    np.testing.assert_allclose(backend.to_host(w), [-0.1, 0.1, -0.1], rtol=1e-12)


def test_trust_ratio_is_one_when_a_norm_is_zero():
    assert trust_ratio(0.0, 3.0) == 1.0
    assert trust_ratio(3.0, 0.0) == 1.0
    assert trust_ratio(3.0, 1.5) == 2.0


def test_lamb_rejects_bad_hyperparameters():
    with pytest.raises(ValueError):
        LAMB(make_params([np.zeros(2)]), betas=(0.9, 1.5))
