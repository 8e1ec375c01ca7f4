"""Adam and AdamW against torch.optim, step for step, in float64 and float32."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.optim import Adam, AdamW, adam_update, adamw_update
from optim_helpers import (PROPERTY, assert_weights_close, dtypes, make_params, make_problem,
                           run_minidist, run_torch, seeds, shape_lists, steps)

@st.composite
def adam_settings(draw):
    return dict(lr=draw(st.floats(1e-4, 0.1)),
                betas=(draw(st.sampled_from([0.0, 0.5, 0.9])),
                       draw(st.sampled_from([0.9, 0.99, 0.999]))),
                eps=draw(st.sampled_from([1e-8, 1e-6, 1e-3])),
                weight_decay=draw(st.sampled_from([0.0, 1e-2, 0.1])),
                amsgrad=draw(st.booleans()))


@PROPERTY
@given(shapes=shape_lists, n_steps=steps, seed=seeds, dtype=dtypes, hyper=adam_settings())
def test_adam_matches_torch_over_steps(shapes, n_steps, seed, dtype, hyper, torch):
    weights, grads = make_problem(shapes, n_steps, seed, dtype)
    ours = run_minidist(lambda ps: Adam(ps, **hyper), weights, grads)
    theirs = run_torch(lambda ps: torch.optim.Adam(ps, **hyper), weights, grads)
    assert_weights_close(ours, theirs, dtype)


@PROPERTY
@given(shapes=shape_lists, n_steps=steps, seed=seeds, dtype=dtypes, hyper=adam_settings())
def test_adamw_matches_torch_over_steps(shapes, n_steps, seed, dtype, hyper, torch):
    weights, grads = make_problem(shapes, n_steps, seed, dtype)
    ours = run_minidist(lambda ps: AdamW(ps, **hyper), weights, grads)
    theirs = run_torch(lambda ps: torch.optim.AdamW(ps, **hyper), weights, grads)
    assert_weights_close(ours, theirs, dtype)


def test_adamw_defaults_match_torch(torch):
    ours = AdamW(make_params([np.zeros(2)])).defaults
    theirs = torch.optim.AdamW([torch.zeros(2, requires_grad=True)]).defaults
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad"):
        assert ours[key] == theirs[key], key


def test_first_adam_step_moves_every_weight_by_lr():
    # At t = 1, m_hat = g and v_hat = g^2, so the step is lr * g / (|g| + eps):
    # about lr in size whatever the gradient's scale. A classic check of bias correction.
    w = backend.from_host(np.zeros(3))
    g = backend.from_host(np.array([1e-3, -5.0, 200.0]))
    m, v = backend.from_host(np.zeros(3)), backend.from_host(np.zeros(3))
    adam_update(w, g, m, v, 1, lr=0.01, eps=0.0)
    np.testing.assert_allclose(backend.to_host(w), [-0.01, 0.01, -0.01], rtol=1e-12)


def test_adam_l2_decay_and_adamw_decoupled_decay_differ():
    # Same gradients, same lambda: only AdamW shrinks w by exactly (1 - lr * lambda)
    # on top of the Adam step, so with g = 0 Adam (L2) still moves w but AdamW only decays it.
    w1 = backend.from_host(np.array([2.0]))
    w2 = backend.from_host(np.array([2.0]))
    zero = backend.from_host(np.array([0.0]))
    state1 = [backend.from_host(np.zeros(1)) for _ in range(2)]
    state2 = [backend.from_host(np.zeros(1)) for _ in range(2)]
    adam_update(w1, zero, *state1, 1, lr=0.1, weight_decay=0.5)
    adamw_update(w2, zero, *state2, 1, lr=0.1, weight_decay=0.5)
    np.testing.assert_allclose(backend.to_host(w1), [2.0 - 0.1])        # step of size lr
    np.testing.assert_allclose(backend.to_host(w2), [2.0 * (1 - 0.05)])  # decay only


def test_adam_update_leaves_the_gradient_untouched():
    w = backend.from_host(np.array([1.0, 2.0]))
    g = backend.from_host(np.array([3.0, 4.0]))
    m, v = backend.from_host(np.zeros(2)), backend.from_host(np.zeros(2))
    adam_update(w, g, m, v, 1, lr=0.1, weight_decay=0.1)
    np.testing.assert_array_equal(backend.to_host(g), [3.0, 4.0])


@pytest.mark.parametrize("bad", [dict(lr=-1.0), dict(eps=-1.0), dict(betas=(1.0, 0.999)),
                                 dict(betas=(0.9, -0.1)), dict(weight_decay=-0.1)])
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_adam_rejects_bad_hyperparameters(cls, bad):
    with pytest.raises(ValueError):
        cls(make_params([np.zeros(2)]), **bad)


@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_amsgrad_keeps_the_step_small_after_a_large_gradient_as_torch_does(cls, torch):
    # a large gradient, then small ones: plain Adam's v decays and its steps grow
    # back; AMSGrad divides by the largest v seen, so its steps stay smaller
    grads = [np.array([10.0])] + [np.array([0.1])] * 30
    weights = [np.array([1.0])]
    ours = run_minidist(lambda ps: {"Adam": Adam, "AdamW": AdamW}[cls](ps, lr=0.1, amsgrad=True),
                        weights, [[g] for g in grads])
    theirs = run_torch(lambda ps: getattr(torch.optim, cls)(ps, lr=0.1, amsgrad=True),
                       weights, [[g] for g in grads])
    assert_weights_close(ours, theirs, "float64")
    plain = run_minidist(lambda ps: {"Adam": Adam, "AdamW": AdamW}[cls](ps, lr=0.1),
                         weights, [[g] for g in grads])
    assert 1.0 - ours[0][0] < 1.0 - plain[0][0]      # moved less far
