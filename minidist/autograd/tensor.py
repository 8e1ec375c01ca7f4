"""``Tensor``: an array of the active backend plus what autograd needs.

    x = Tensor(data, requires_grad=True)
    y = (x * x).sum()
    y.backward()          # x.grad == 2 * x.data

``.data`` is the raw array (NumPy, CuPy or guard); ``.grad`` is an array of
the same shape once a backward has reached the tensor, and gradients
accumulate across backward calls until ``.grad`` is reset to ``None``.
A tensor made by an op remembers its op node in ``._ctx``; a tensor made
by the user is a *leaf* (``._ctx is None``).

Operators and methods are thin: each calls one ``Function`` from
``minidist.autograd.ops``, where forward and backward sit side by side.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist import backend


class Tensor:
    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_out_index", "_hooks",
                 "__weakref__")
    # Make `ndarray + Tensor` call Tensor.__radd__ instead of broadcasting.
    __array_ufunc__ = None

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None):
        if isinstance(data, Tensor):
            data = data.data
        if not backend.is_array(data):
            data = backend.from_host(data, dtype)
        elif dtype is not None and data.dtype != dtype:
            data = data.astype(dtype)
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None
        self._out_index = 0
        self._hooks: list[Callable] = []
        if requires_grad and data.dtype.kind not in "fc":
            raise TypeError(f"only floating-point tensors can require grad, "
                            f"not {data.dtype}")

    @classmethod
    def _from_op(cls, data: Any, ctx: Any, index: int) -> "Tensor":
        t = Tensor.__new__(Tensor)
        t.data = data
        t.grad = None
        t.requires_grad = True
        t._ctx = ctx
        t._out_index = index
        t._hooks = []
        return t

    # -- autograd -----------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf."""
        from minidist.autograd.engine import backward
        backward(self, grad, retain_graph=retain_graph)

    def detach(self) -> "Tensor":
        """The same data, cut from the graph."""
        return Tensor(self.data)

    def requires_grad_(self, mode: bool = True) -> "Tensor":
        if self._ctx is not None:
            raise RuntimeError("requires_grad_ is for leaf tensors")
        if mode and self.data.dtype.kind not in "fc":  # the same rule as __init__
            raise TypeError(f"only floating-point tensors can require grad, "
                            f"not {self.data.dtype}")
        self.requires_grad = mode
        return self

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    def register_post_accumulate_grad_hook(self, hook: Callable[["Tensor"], None]):
        """Call ``hook(self)`` each time backward has finished adding into ``.grad``.

        Only for leaves. Returns a handle whose ``remove()`` unregisters it.
        """
        if self._ctx is not None:
            raise RuntimeError("post-accumulate-grad hooks are for leaf tensors")
        self._hooks.append(hook)
        return RemovableHandle(self._hooks, hook)

    # -- array facts --------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        return len(self.data)

    def numpy(self):
        """A host NumPy copy of the data (explicit transfer on every backend)."""
        return backend.to_host(self.data).copy()

    def item(self) -> float:
        return self.data.item()

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({backend.to_host(self.data)!r}{grad})"

    # -- operators ----------------------------------------------------------
    def __add__(self, other):
        return ops.Add.apply(self, other)

    def __radd__(self, other):
        return ops.Add.apply(other, self)

    def __sub__(self, other):
        return ops.Sub.apply(self, other)

    def __rsub__(self, other):
        return ops.Sub.apply(other, self)

    def __mul__(self, other):
        return ops.Mul.apply(self, other)

    def __rmul__(self, other):
        return ops.Mul.apply(other, self)

    def __truediv__(self, other):
        return ops.Div.apply(self, other)

    def __rtruediv__(self, other):
        return ops.Div.apply(other, self)

    def __neg__(self):
        return ops.Neg.apply(self)

    def __pow__(self, exponent):
        return ops.Pow.apply(self, exponent)

    def __rpow__(self, base):
        return ops.Pow.apply(base, self)

    def __matmul__(self, other):
        return ops.MatMul.apply(self, other)

    def __rmatmul__(self, other):
        return ops.MatMul.apply(other, self)

    def __getitem__(self, key):
        return ops.GetItem.apply(self, key=_raw_index(key))

    # comparisons give boolean tensors outside the graph, as in PyTorch
    def __lt__(self, other):
        return Tensor(self.data < array_of(other))

    def __le__(self, other):
        return Tensor(self.data <= array_of(other))

    def __gt__(self, other):
        return Tensor(self.data > array_of(other))

    def __ge__(self, other):
        return Tensor(self.data >= array_of(other))

    def __eq__(self, other):  # noqa: D105 (elementwise, like torch)
        return Tensor(self.data == array_of(other))

    def __ne__(self, other):
        return Tensor(self.data != array_of(other))

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        # like torch: fine for one element, an error for many
        return bool(self.data)

    # -- methods ------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False):
        return ops.Sum.apply(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims: bool = False):
        return ops.Mean.apply(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims: bool = False):
        return ops.Max.apply(self, axis=axis, keepdims=keepdims)

    def var(self, axis=None, keepdims: bool = False, correction: int = 1):
        return ops.Var.apply(self, axis=axis, keepdims=keepdims, correction=correction)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.Reshape.apply(self, shape=shape)

    view = reshape

    def permute(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.Permute.apply(self, axes=axes)

    def transpose(self, axis0: int, axis1: int):
        """Swap two axes (PyTorch's ``transpose``)."""
        axes = list(range(self.ndim))
        axes[axis0], axes[axis1] = axes[axis1], axes[axis0]
        return ops.Permute.apply(self, axes=tuple(axes))

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    def exp(self):
        return ops.Exp.apply(self)

    def log(self):
        return ops.Log.apply(self)

    def sqrt(self):
        return ops.Sqrt.apply(self)

    def tanh(self):
        return ops.Tanh.apply(self)

    def relu(self):
        return ops.Relu.apply(self)

    def sigmoid(self):
        return ops.Sigmoid.apply(self)

    def softmax(self, axis: int = -1):
        return ops.Softmax.apply(self, axis=axis)

    def log_softmax(self, axis: int = -1):
        return ops.LogSoftmax.apply(self, axis=axis)

    def masked_fill(self, mask, value: float):
        return ops.MaskedFill.apply(self, array_of(mask), value=value)

    def astype(self, dtype):
        """Cast; the gradient is cast back to this tensor's dtype."""
        return ops.Cast.apply(self, dtype=dtype)


class RemovableHandle:
    """What a ``register_*_hook`` returns (torch's name): ``remove()`` unregisters the hook."""

    def __init__(self, hooks: list, hook: Callable):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def array_of(x: Any) -> Any:
    """The array under ``x`` (a Tensor's ``.data``), or ``x`` itself (an array, a number)."""
    return x.data if isinstance(x, Tensor) else x


def _raw_index(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(array_of(k) for k in key)
    return array_of(key)


def tensor(data: Any, requires_grad: bool = False, dtype: Any = None) -> Tensor:
    """``Tensor(data, ...)``, spelled like ``torch.tensor``."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


from minidist.autograd import ops  # noqa: E402  (ops import Tensor lazily)
