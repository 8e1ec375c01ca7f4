"""A leaf's ``grad_home``: backward copies the leaf's first gradient into that
array (DDP's bucket view) instead of a new one, accumulates later ones into it,
and ignores a home of another shape or dtype."""
import numpy as np

from minidist.autograd import Tensor
from minidist.backend import to_host, xp


def same_memory(a, b):
    return np.shares_memory(to_host(a), to_host(b))


def test_first_gradient_lands_in_the_home_and_later_ones_accumulate_there():
    w = Tensor(xp.ones(3), requires_grad=True)
    home = xp.full(3, 7.0)
    w.grad_home = home
    (w * 2.0).sum().backward()
    assert w.grad is home and to_host(home).tolist() == [2.0, 2.0, 2.0]
    (w * 3.0).sum().backward()  # += into it (the guard backend wraps it anew)
    assert same_memory(w.grad, home) and to_host(home).tolist() == [5.0, 5.0, 5.0]


def test_a_home_of_another_shape_or_dtype_is_not_used():
    for home in (xp.zeros(4), xp.zeros(3, dtype="float32")):
        w = Tensor(xp.ones(3), requires_grad=True)
        w.grad_home = home
        (w * 2.0).sum().backward()
        assert not same_memory(w.grad, home) and to_host(w.grad).tolist() == [2.0, 2.0, 2.0]
        assert not to_host(home).any()
