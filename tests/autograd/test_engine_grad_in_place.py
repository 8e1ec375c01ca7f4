"""A leaf that already holds a ``.grad`` array (DDP's bucket view) gets its
gradients added into that array in place, as in PyTorch: the same array, the
same memory, every later gradient accumulated there; from -0.0 the first
gradient's bits exactly; a ``.grad`` of another shape is an error naming it;
an empty ``.grad`` (set_empty_grad) gets the first gradient copied in."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minidist.autograd import Tensor, set_empty_grad
from minidist.backend import to_host, xp


def same_memory(a, b):
    return bool(xp.shares_memory(a, b))  # on the device: to_host would copy


def test_gradients_accumulate_in_place_into_an_existing_grad():
    w = Tensor(xp.ones(3), requires_grad=True)
    home = xp.full(3, -0.0)
    w.grad = home
    (w * 2.0).sum().backward()
    assert w.grad is home and to_host(home).tolist() == [2.0, 2.0, 2.0]
    (w * 3.0).sum().backward()
    assert w.grad is home and same_memory(w.grad, home)
    assert to_host(home).tolist() == [5.0, 5.0, 5.0]


def test_from_minus_zero_the_first_gradient_keeps_its_bits():
    w = Tensor(xp.asarray([1.0, -1.0, 0.0]), requires_grad=True)
    (w * xp.asarray([-0.0, 0.0, -0.0])).sum().backward()
    fresh = to_host(w.grad).copy()                       # a new array: the gradient's bits
    w2 = Tensor(xp.asarray([1.0, -1.0, 0.0]), requires_grad=True)
    w2.grad = xp.full(3, -0.0)
    (w2 * xp.asarray([-0.0, 0.0, -0.0])).sum().backward()
    assert to_host(w2.grad).tobytes() == fresh.tobytes()


def test_a_grad_of_another_shape_is_an_error_naming_it():
    w = Tensor(xp.ones(3), requires_grad=True)
    w.grad = xp.zeros(4)
    with pytest.raises(RuntimeError, match=r"\.grad has shape \(4,\)"):
        (w * 2.0).sum().backward()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(width=32), min_size=1, max_size=6),
       st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_an_empty_grad_takes_the_first_gradient_bit_for_bit_then_adds(values, scale):
    """set_empty_grad: whatever the memory held (NaN here), the first backward
    leaves the bits of the gradient a fresh .grad gets (those of -0.0 + g), in
    the same array; the second adds in place."""
    coef = xp.asarray(values, dtype="float32")
    w = Tensor(xp.full(len(values), scale, dtype="float32"), requires_grad=True)
    w2 = Tensor(xp.full(len(values), scale, dtype="float32"), requires_grad=True)
    home = xp.full(len(values), float("nan"), dtype="float32")
    with np.errstate(invalid="ignore", over="ignore"):   # inf * 0 drawn on purpose
        (w * coef).sum().backward()
        fresh = to_host(w.grad).copy()
        set_empty_grad(w2, home)
        assert w2.grad is home
        (w2 * coef).sum().backward()
        assert w2.grad is home and to_host(home).tobytes() == fresh.tobytes()
        (w2 * coef).sum().backward()
        assert to_host(home).tobytes() == (fresh + fresh).tobytes()


def test_only_the_array_given_as_empty_is_overwritten():
    """A .grad replaced after set_empty_grad is a written one: added into."""
    w = Tensor(xp.ones(3), requires_grad=True)
    set_empty_grad(w, xp.full(3, float("nan")))
    w.grad = xp.ones(3)
    (w * 2.0).sum().backward()
    assert to_host(w.grad).tolist() == [3.0, 3.0, 3.0]
