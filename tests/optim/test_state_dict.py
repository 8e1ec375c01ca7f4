"""state_dict / load_state_dict: stopping and resuming equals never stopping."""
import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend
from minidist.optim import LAMB, LARS, SGD, Adam, AdamW
from optim_helpers import PROPERTY, host, make_params, make_problem, seeds, set_grads

OPTIMIZERS = {
    "sgd": lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda ps: Adam(ps, lr=0.01, weight_decay=0.1),
    "adamw": lambda ps: AdamW(ps, lr=0.01),
    "lamb": lambda ps: LAMB(ps, lr=0.01),
    "lars": lambda ps: LARS(ps, lr=1.0, weight_decay=1e-4),
}


def two_groups(make, params):
    """The optimizer over two param groups, to exercise the index numbering."""
    opt = make(params[:1])
    opt.add_param_group({"params": params[1:], "lr": 0.005})
    return opt


@PROPERTY
@given(name=st.sampled_from(sorted(OPTIMIZERS)), seed=seeds, k=st.integers(0, 3),
       rest=st.integers(1, 3))
def test_resume_from_state_dict_equals_uninterrupted(name, seed, k, rest):
    weights, grads = make_problem([(3, 2), (4,), (2,)], k + rest, seed)
    make = OPTIMIZERS[name]
    params = make_params(weights)
    opt = two_groups(make, params)
    for step, round_ in enumerate(grads):
        if step == k:
            # "save" (a deep copy: state_dict hands out the live buffers, as torch does)
            saved = copy.deepcopy(opt.state_dict())
            saved_weights = host(params)
        set_grads(params, round_)
        opt.step()
    uninterrupted = host(params)

    resumed_params = make_params(saved_weights)
    resumed = two_groups(make, resumed_params)
    resumed.load_state_dict(saved)
    for round_ in grads[k:]:
        set_grads(resumed_params, round_)
        resumed.step()
    for a, b in zip(host(resumed_params), uninterrupted):
        np.testing.assert_array_equal(a, b)            # the same operations: bit for bit


def test_state_dict_is_keyed_by_parameter_index_like_torch():
    params = make_params([np.ones(2), np.ones(3)])
    opt = AdamW(params)
    set_grads(params, [np.ones(2), np.ones(3)])
    opt.step()
    sd = opt.state_dict()
    assert sorted(sd) == ["param_groups", "state"]
    assert sd["param_groups"][0]["params"] == [0, 1]
    assert sd["param_groups"][0]["lr"] == 1e-3
    assert sorted(sd["state"][1]) == ["exp_avg", "exp_avg_sq", "step"]
    assert sd["state"][1]["step"] == 1
    assert backend.is_array(sd["state"][1]["exp_avg"])


def test_loaded_state_is_a_copy():
    params = make_params([np.ones(2)])
    opt = SGD(params, lr=0.1, momentum=0.9)
    set_grads(params, [np.ones(2)])
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    fresh = SGD(make_params([np.ones(2)]), lr=0.1, momentum=0.9)
    fresh.load_state_dict(sd)
    sd["state"][0]["momentum_buffer"][...] = 7.0
    (p,) = fresh.param_groups[0]["params"]
    np.testing.assert_array_equal(backend.to_host(fresh.state[p]["momentum_buffer"]), [1.0, 1.0])


def test_load_accepts_host_arrays_from_a_checkpoint():
    params = make_params([np.ones(2)])
    opt = Adam(params)
    set_grads(params, [np.ones(2)])
    opt.step()
    sd = opt.state_dict()
    # as a file reader might hand them back: NumPy arrays and NumPy integers
    sd["state"][0] = {k: (np.int64(v) if isinstance(v, int) else backend.to_host(v).copy())
                      for k, v in sd["state"][0].items()}
    fresh = Adam(make_params([np.ones(2)]))
    fresh.load_state_dict(sd)
    (p,) = fresh.param_groups[0]["params"]
    assert backend.is_array(fresh.state[p]["exp_avg"])
    assert fresh.state[p]["step"] == 1 and type(fresh.state[p]["step"]) is int


def trained_sd(shapes, groups=1):
    params = make_params([np.ones(s) for s in shapes])
    opt = Adam(params) if groups == 1 else Adam([{"params": [p]} for p in params])
    set_grads(params, [np.ones(s) for s in shapes])
    opt.step()
    return opt.state_dict()


@pytest.mark.parametrize("sd, message", [
    (trained_sd([(3,)]), "shape"),                       # buffers sized for another model
    (trained_sd([(2,), (2,)]), "2 parameters"),
    (trained_sd([(2,), (2,)], groups=2), "2 param groups"),
    ({"state": {}}, "not an optimizer state dict"),
])
def test_mismatched_state_dict_raises_clearly(sd, message):
    opt = Adam(make_params([np.ones(2)]))
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(sd)
    assert opt.state == {}                                # and nothing was half-loaded
