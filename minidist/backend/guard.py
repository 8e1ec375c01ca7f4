"""The ``guard`` backend: NumPy arrays that behave like CuPy's where it matters.

CuPy refuses implicit transfers to the host: ``numpy.asarray(device_array)``
raises ``TypeError``, and so does an operation that mixes a host array into
device arrays. ``GuardArray`` wraps a NumPy array and refuses the same things,
so that a stray ``np.`` call in core code fails on any machine, not only on
the first GPU it meets. ``GuardNamespace`` is the guard's ``xp``: NumPy's
functions, unwrapping guard arrays on the way in and wrapping results on the
way out. ``minidist.backend`` selects it with ``MINIDIST_BACKEND=guard``.

CuPy compiles its kernels with ``-ftz=true``: float32 arithmetic, comparisons and
float32 <-> float64 casts read a subnormal float32 as 0 and write 0 for one; bit
views, copies, ``where``, ``copysign``, ``signbit`` and ``isfinite`` keep them.
``flush_subnormals(True)`` makes the guard do the same (guard_ftz.py; the
list is what scripts/ftz_probe.py found on an H100); it costs a few passes per operation, so the
suite turns it on where subnormals are the subject (tests/precision).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from minidist.backend.guard_ftz import flush_call, flush_cast, flush_subnormals  # noqa: F401

_HOST_MIX = ("a host numpy.ndarray was mixed into an operation on device arrays "
             "(guard backend, behaving like CuPy); convert it explicitly with "
             "minidist.backend.from_host(...)")


def _unwrap(obj: Any) -> Any:
    """Guard arrays -> their NumPy array; a plain ndarray is an error (like CuPy)."""
    if isinstance(obj, GuardArray):
        return obj._a
    if isinstance(obj, np.ndarray):
        raise TypeError(_HOST_MIX)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _unwrap(v) for k, v in obj.items()}
    return obj


def _wrap(obj: Any) -> Any:
    """NumPy results -> guard arrays. Scalars become 0-d arrays, as CuPy returns."""
    if isinstance(obj, np.ndarray):
        return GuardArray(obj)
    if isinstance(obj, np.generic):
        return GuardArray(np.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


class GuardArray(NDArrayOperatorsMixin):
    """A NumPy array in disguise that behaves like a CuPy device array.

    Operators, methods and ``xp.*`` functions work as usual. What fails, with
    ``TypeError`` as on CuPy: ``numpy.asarray(a)`` / ``numpy.array(a)`` (implicit
    transfer to the host), and operations that mix in a host ``numpy.ndarray``.
    ``a.get()`` is the explicit transfer, as in CuPy.
    """

    __slots__ = ("_a",)

    def __init__(self, a: np.ndarray):
        self._a = a

    # -- the conversions CuPy refuses --------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed "
                        "(guard backend, behaving like CuPy). "
                        "Use minidist.backend.to_host(a) to copy it to the host.")

    def get(self) -> np.ndarray:
        """Explicit device -> host copy (CuPy's ``ndarray.get``)."""
        return self._a.copy()

    # -- NumPy protocol: dispatch to NumPy on the unwrapped arrays ---------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _wrap(flush_call(getattr(ufunc, method), ufunc, _unwrap(inputs), _unwrap(kwargs)))

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    # -- attributes ---------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: GuardArray(self._a.T))
    real = property(lambda self: GuardArray(self._a.real))
    imag = property(lambda self: GuardArray(self._a.imag))

    def __getattr__(self, name: str):
        # Methods of ndarray (sum, reshape, astype, view, ...): unwrap the
        # arguments, wrap the result. Dunder lookups are refused: forwarding
        # __array_interface__ would hand NumPy the host buffer behind our back.
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return attr
        if name == "astype":
            return lambda *args, **kwargs: _wrap(flush_cast(self._a, *_unwrap(args),
                                                            **_unwrap(kwargs)))

        def method(*args, **kwargs):
            return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)))
        return method

    # -- indexing -----------------------------------------------------------
    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        for row in self._a:
            yield _wrap(row)

    # -- scalars (CuPy allows these on size-1 arrays; they synchronise) -----
    def __bool__(self) -> bool:
        return bool(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __int__(self) -> int:
        return int(self._a)

    # No __index__: CuPy's arrays have none, so `range(a)`, `lst[a]` or `x.reshape(a)`
    # on a device array raises TypeError; say int(a), which synchronises, on purpose.

    def __complex__(self) -> complex:
        return complex(self._a)

    def __repr__(self) -> str:
        return "guard:" + repr(self._a)

    __hash__ = None  # arrays are not hashable

    # pickling (multiprocess may pickle small metadata arrays)
    def __reduce__(self):
        return (GuardArray, (self._a,))


class GuardNamespace:
    """The ``xp`` of the guard backend: NumPy's functions, wrapped.

    Explicit transfers (``asarray``, ``array``, ``ascontiguousarray``) accept host
    data; every other function rejects a host ``numpy.ndarray`` argument.
    ``xp.random`` is refused: draw random numbers with ``backend.Generator`` so
    they are the same on every backend.
    """

    _TRANSFERS = ("asarray", "array", "asanyarray", "ascontiguousarray")
    ndarray = GuardArray

    def __getattr__(self, name: str):
        if name == "random":
            raise AttributeError("xp.random differs between NumPy and CuPy; "
                                 "use minidist.backend.Generator(seed)")
        attr = getattr(np, name)
        if name in self._TRANSFERS:
            fn = _make_transfer(attr)
        elif name == "where":
            fn = _where_like_cupy
        elif isinstance(attr, type) or not callable(attr):
            fn = attr  # dtypes, constants
        elif hasattr(attr, "__name__") and type(attr).__name__ == "module":
            fn = attr
        else:
            fn = _make_wrapped(attr)
        setattr(self, name, fn)  # cache
        return fn

    @property
    def linalg(self):
        return _GuardSubmodule(np.linalg)


class _GuardSubmodule:
    def __init__(self, mod):
        self._mod = mod

    def __getattr__(self, name):
        return _make_wrapped(getattr(self._mod, name))


def _make_wrapped(fn):
    def wrapped(*args, **kwargs):
        return _wrap(flush_call(fn, fn, _unwrap(args), _unwrap(kwargs)))
    wrapped.__name__ = getattr(fn, "__name__", "fn")
    return wrapped


def _where_like_cupy(condition, *args, **kwargs):
    """``xp.where``: CuPy's takes only an array condition, not a Python bool."""
    if not isinstance(condition, GuardArray):
        raise TypeError(f"xp.where's condition must be an array on CuPy, not "
                        f"{type(condition).__name__} (guard backend, behaving like CuPy); "
                        "wrap it in xp.asarray(...)")
    return _wrap(np.where(condition._a, *_unwrap(args), **_unwrap(kwargs)))


def _host_ok(obj):
    if isinstance(obj, GuardArray):
        return obj._a
    if isinstance(obj, (list, tuple)):
        return type(obj)(_host_ok(o) for o in obj)
    return obj


def _make_transfer(fn):
    def transfer(obj, *args, **kwargs):
        return GuardArray(np.asarray(fn(_host_ok(obj), *args, **kwargs)))
    transfer.__name__ = fn.__name__
    return transfer


