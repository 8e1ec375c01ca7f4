"""SGD against torch.optim.SGD, step for step (momentum, dampening, Nesterov, decay)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.optim import SGD, sgd_update
from optim_helpers import (PROPERTY, assert_weights_close, dtypes, make_params, make_problem,
                           run_minidist, run_torch, seeds, set_grads, shape_lists, steps)

@st.composite
def sgd_settings(draw):
    momentum = draw(st.sampled_from([0.0, 0.5, 0.9]))
    nesterov = momentum > 0 and draw(st.booleans())
    # torch forbids dampening with Nesterov; otherwise draw it too
    dampening = 0.0 if nesterov else draw(st.sampled_from([0.0, 0.1, 0.5]))
    return dict(lr=draw(st.floats(1e-3, 0.5)), momentum=momentum, dampening=dampening,
                weight_decay=draw(st.sampled_from([0.0, 1e-2, 0.1])), nesterov=nesterov)


@PROPERTY
@given(shapes=shape_lists, n_steps=steps, seed=seeds, dtype=dtypes, hyper=sgd_settings())
def test_sgd_matches_torch_over_steps(shapes, n_steps, seed, dtype, hyper, torch):
    weights, grads = make_problem(shapes, n_steps, seed, dtype)
    ours = run_minidist(lambda ps: SGD(ps, **hyper), weights, grads)
    theirs = run_torch(lambda ps: torch.optim.SGD(ps, **hyper), weights, grads)
    assert_weights_close(ours, theirs, dtype)


def test_sgd_first_momentum_step_is_the_plain_gradient():
    # torch's convention: b_1 = g_1 (not (1 - dampening) * g_1), so the first step is
    # w - lr * g whatever the dampening.
    w = backend.from_host(np.array([1.0, -2.0]))
    g = backend.from_host(np.array([0.5, 0.25]))
    buf = sgd_update(w, g, None, lr=0.1, momentum=0.9, dampening=0.5)
    np.testing.assert_array_equal(backend.to_host(w), [0.95, -2.025])
    np.testing.assert_array_equal(backend.to_host(buf), [0.5, 0.25])


def test_sgd_update_leaves_the_gradient_untouched():
    w = backend.from_host(np.array([1.0, 2.0]))
    g = backend.from_host(np.array([3.0, 4.0]))
    buf = sgd_update(w, g, None, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True)
    sgd_update(w, g, buf, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True)
    np.testing.assert_array_equal(backend.to_host(g), [3.0, 4.0])


def test_sgd_without_momentum_keeps_no_state():
    weights, grads = make_problem([(3,)], 2, seed=0)
    params = make_params(weights)
    opt = SGD(params, lr=0.1)
    set_grads(params, grads[0])
    opt.step()
    assert opt.state[params[0]] == {}


@pytest.mark.parametrize("bad", [dict(lr=-1.0), dict(momentum=-0.1), dict(weight_decay=-1.0),
                                 dict(nesterov=True), dict(nesterov=True, momentum=0.9,
                                                           dampening=0.1)])
def test_sgd_rejects_bad_hyperparameters(bad):
    with pytest.raises(ValueError):
        SGD(make_params([np.zeros(2)]), **bad)
