"""The Optimizer base: param groups, skipped parameters, zero_grad, loud bad input."""
import numpy as np
import pytest

from minidist import backend
from minidist.autograd import Tensor
from minidist.optim import LAMB, LARS, SGD, Adam, AdamW, Muon
from optim_helpers import host, make_params, set_grads

ALL = [SGD, Adam, AdamW, LAMB, LARS]


@pytest.mark.parametrize("cls", ALL)
def test_parameter_without_grad_is_skipped(cls):
    used, unused = make_params([np.ones(3), np.ones(2)])
    opt = cls([used, unused], lr=0.1)
    used.grad = backend.from_host(np.ones(3))
    opt.step()
    np.testing.assert_array_equal(backend.to_host(unused.data), np.ones(2))
    assert unused not in opt.state
    assert not np.array_equal(backend.to_host(used.data), np.ones(3))


def test_param_groups_use_their_own_hyperparameters():
    a, b = make_params([np.ones(2), np.ones(2)])
    opt = SGD([{"params": [a], "lr": 0.5}, {"params": [b]}], lr=0.1)
    set_grads([a, b], [np.ones(2), np.ones(2)])
    opt.step()
    np.testing.assert_allclose(host([a, b]), [[0.5, 0.5], [0.9, 0.9]])
    assert opt.param_groups[1]["momentum"] == 0.0          # filled in from the defaults


def test_lr_written_into_a_group_takes_effect_next_step():
    (w,) = make_params([np.zeros(1)])
    opt = SGD([w], lr=1.0)
    opt.param_groups[0]["lr"] = 0.25                       # what a scheduler does
    set_grads([w], [np.ones(1)])
    opt.step()
    np.testing.assert_array_equal(host([w])[0], [-0.25])


def test_zero_grad_sets_none_or_zeros():
    (w,) = make_params([np.ones(2)])
    opt = SGD([w])
    set_grads([w], [np.ones(2)])
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(backend.to_host(w.grad), [0.0, 0.0])
    opt.zero_grad()
    assert w.grad is None


def test_step_runs_the_closure_and_returns_its_loss():
    (w,) = make_params([np.array([2.0])])
    opt = SGD([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss
    loss = opt.step(closure)
    assert float(loss.item()) == 4.0
    np.testing.assert_allclose(host([w])[0], [2.0 - 0.1 * 4.0])


def test_bad_params_raise():
    (w,) = make_params([np.ones(2)])
    with pytest.raises(ValueError, match="empty"):
        SGD([])
    with pytest.raises(TypeError, match="single Tensor"):
        SGD(w)
    with pytest.raises(TypeError, match="Tensors"):
        SGD([np.ones(2)])
    with pytest.raises(ValueError, match="more than once"):
        SGD([w, w])
    with pytest.raises(ValueError, match="more than once"):
        SGD([{"params": [w]}, {"params": [w]}])
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        SGD([{"params": [w], "betas": (0.9, 0.99)}])
    with pytest.raises(ValueError, match="non-leaf"):
        SGD([w * 2.0])


def test_gradient_of_the_wrong_shape_raises():
    (w,) = make_params([np.ones(3)])
    opt = AdamW([w])
    w.grad = backend.from_host(np.ones(2))
    with pytest.raises(ValueError, match="does not match"):
        opt.step()


def test_tensor_that_never_gets_a_grad_is_left_alone():
    # a Tensor that does not require grad is accepted (as in torch) but never has a grad
    t = Tensor(backend.from_host(np.ones(2)))
    opt = SGD([t], lr=0.1)
    opt.step()
    np.testing.assert_array_equal(backend.to_host(t.data), [1.0, 1.0])


def test_gradient_of_another_dtype_raises():
    (w,) = make_params([np.ones(3, dtype=np.float32)])
    opt = SGD([w], lr=0.1)
    w.grad = backend.from_host(np.ones(3, dtype=np.float64))
    with pytest.raises(ValueError, match="float64 does not match"):
        opt.step()


def test_step_hooks_run_before_and_after_the_update_until_removed():
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.optim import SGD
    p = Tensor(backend.from_host(np.ones(2)), requires_grad=True)
    opt = SGD([p], lr=0.5)
    seen = []
    pre = opt.register_step_pre_hook(lambda o, a, k: seen.append(("pre", float(backend.to_host(p.data)[0]))))
    post = opt.register_step_post_hook(lambda o, a, k: seen.append(("post", float(backend.to_host(p.data)[0]))))
    p.grad = backend.from_host(np.ones(2))
    opt.step()
    pre.remove()
    post.remove()
    opt.step()
    assert seen == [("pre", 1.0), ("post", 0.5)]


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW, LAMB, LARS, Muon])
def test_a_step_post_hook_sees_every_parameter_already_updated(cls):
    """As torch's: post hooks run after the whole update (DiLoCo's outer sync is one, and
    must average the parameters of the inner step just taken), for an optimizer that
    updates a group whole (Muon orthogonalises after every momentum) too."""
    (w,) = make_params([np.arange(12.0).reshape(3, 4) / 7])
    opt = cls([w], lr=0.1)
    seen = []
    opt.register_step_post_hook(lambda o, a, k: seen.append(host([w])[0]))
    set_grads([w], [np.ones((3, 4))])
    opt.step()
    assert np.array_equal(seen[0], host([w])[0])
    assert not np.array_equal(seen[0], np.arange(12.0).reshape(3, 4) / 7)
