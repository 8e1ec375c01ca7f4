"""The array backend: one switch between NumPy, CuPy and a CuPy-like guard.

Every core module gets its arrays from here::

    from minidist.backend import xp      # numpy, cupy, or the guard namespace
    y = xp.exp(x)

`xp` follows the active backend, chosen by the environment variable
``MINIDIST_BACKEND`` (``numpy`` by default, ``cupy``, or ``guard``) or by
``set_backend(name)`` at run time. This package is the only part of the core that
imports numpy or cupy by name for array work.

The three backends
------------------
- ``numpy``: plain NumPy on the CPU.
- ``cupy``: CuPy on an NVIDIA GPU. Arrays live in device memory; moving them to
  the host is explicit (``to_host``), and CuPy raises ``TypeError`` on an
  implicit conversion such as ``numpy.asarray(device_array)``.
- ``guard`` (guard.py): NumPy underneath, but its arrays behave like CuPy's where it
  matters: ``numpy.asarray(a)`` raises ``TypeError``, and so does mixing a host
  NumPy array into an operation on guard arrays. The test suite runs a second
  time under it, so a stray ``np.`` call in core code fails on a machine
  without a GPU instead of on the first GPU it meets.

Helpers that are not portable between NumPy and CuPy live here too:
``to_host`` / ``from_host``, a seeded ``Generator`` that draws the same numbers
on every backend, ``scatter_add``, ``bits`` / ``from_bits``, ``synchronize``,
``use_device`` / ``current_device`` / ``device_name`` / ``device_type``; and from
measure.py, ``Timer``, ``MemoryTracker``, ``MatmulFlopCounter`` and ``memory_in_use``.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

import numpy as np

from minidist.backend import guard_ftz
from minidist.backend.guard import GuardArray, GuardNamespace, _unwrap

BACKENDS = ("numpy", "cupy", "guard")


# --------------------------------------------------------------------------
# The active backend and the `xp` proxy.
# --------------------------------------------------------------------------

class _ActiveNamespace:
    """``xp``: forwards attribute lookups to the active array module.

    Lookups are cached on the instance, so after the first use ``xp.exp`` is a
    plain attribute read; ``set_backend`` clears the cache.
    """

    def __getattr__(self, name: str):
        value = getattr(_state["module"], name)
        self.__dict__[name] = value
        return value

    def __repr__(self) -> str:
        return f"<minidist xp: {_state['name']}>"


xp: Any = _ActiveNamespace()
_state: dict = {"name": None, "module": None}


def set_backend(name: str) -> None:
    """Switch the active array backend: ``"numpy"``, ``"cupy"`` or ``"guard"``.

    Arrays made under one backend are not converted; switch before building
    tensors (or move them with ``to_host`` / ``from_host``).
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS} "
                         "(set MINIDIST_BACKEND or call set_backend)")
    if name == "cupy":
        try:
            import cupy  # noqa: F401
        except ImportError as e:
            raise ImportError("MINIDIST_BACKEND=cupy needs CuPy: "
                              "pip install 'minidist[cuda]'") from e
        module = cupy
    elif name == "guard":
        module = GuardNamespace()
    else:
        module = np
    if name in ("numpy", "guard"):
        tune_host_allocator()
    _state["name"] = name
    _state["module"] = module
    xp.__dict__.clear()


def tune_host_allocator() -> bool:
    """Keep freed array buffers in the process instead of returning them to the OS.

    glibc hands out large blocks (>128 KiB at first) with mmap and gives them
    back on free, so each new activation of a training step page-faults its
    memory in again: about a quarter of a small GPT step on the CPU. Raising
    the mmap and trim thresholds (to 32 MiB and 1 GiB) lets freed buffers be
    reused. Set MINIDIST_TUNE_MALLOC=0 to leave the allocator alone. Returns
    True if the settings were applied.
    """
    if os.environ.get("MINIDIST_TUNE_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (e.g. musl): nothing to tune
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    ok = libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    ok &= libc.mallopt(m_trim_threshold, 1024 * 1024 * 1024)
    return bool(ok)


def get_backend() -> str:
    """The name of the active backend."""
    return _state["name"]


def array_module() -> Any:
    """The active backend's array module itself (numpy, cupy, the guard namespace):
    what ``xp`` forwards to, for a caller that puts something in front of it."""
    return _state["module"]


# --------------------------------------------------------------------------
# Non-portable helpers.
# --------------------------------------------------------------------------

def is_array(obj: Any) -> bool:
    """True if ``obj`` is an array of the active backend."""
    return isinstance(obj, xp.ndarray)


def to_host(a: Any) -> np.ndarray:
    """Copy (or view, for NumPy) an array of any backend into a host NumPy array."""
    if isinstance(a, GuardArray):
        return a._a
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # cupy.ndarray
        return a.get()
    return np.asarray(a)


def from_host(a: Any, dtype: Any = None) -> Any:
    """Host data (NumPy array, list, scalar) -> an array of the active backend.

    An array that is already the backend's passes through (cast to ``dtype`` if given),
    so code that is handed either kind need not ask which it got."""
    if _state["name"] == "numpy":
        return np.asarray(a, dtype=dtype)
    if isinstance(a, xp.ndarray):  # already on the device
        return xp.asarray(a, dtype=dtype)
    return xp.asarray(np.asarray(a, dtype=dtype))


def scatter_add(target: Any, indices: Any, values: Any) -> None:
    """In place: ``target[indices[i]] += values[i]``, repeated indices summed.

    (``target[indices] += values`` would keep only one of the repeats.) The repeats
    are added in the order of ``indices``, one after another, on every backend: on
    CuPy by ``ordered_scatter.ordered_scatter_add`` (a 1-D index array into a
    C-contiguous target) rather than atomic adds, whose order, and so whose last
    bit, changes from run to run.
    """
    name = _state["name"]
    if name == "cupy":
        if (isinstance(indices, xp.ndarray) and indices.ndim == 1
                and indices.dtype.kind in "iu" and target.flags.c_contiguous):
            from minidist.backend.ordered_scatter import ordered_scatter_add
            ordered_scatter_add(target, indices, xp.broadcast_to(
                values, indices.shape + target.shape[1:]))
        else:  # other keys (slices, tuples of arrays): atomic adds, in no fixed order
            import cupyx
            cupyx.scatter_add(target, indices, values)
    elif name == "guard":
        np.add.at(target._a, _unwrap(indices), _unwrap(values))
    else:
        np.add.at(target, indices, values)


_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def bits(a: Any) -> Any:
    """The raw bit patterns of a float array, as unsigned ints of the same width."""
    return a.view(getattr(xp, _UINT[a.dtype.itemsize]))


def from_bits(u: Any, dtype: Any) -> Any:
    """Inverse of ``bits``: reinterpret unsigned ints as floats of ``dtype``."""
    return u.view(dtype)


def flushes_subnormals() -> bool:
    """Whether float32 arithmetic reads and writes subnormals as zero here: CuPy's
    kernels do (``-ftz=true``), and the guard does when told to (guard_ftz.py).
    minidist.precision works around it where a subnormal is a value it must keep."""
    if _state["name"] == "cupy":
        return True
    return _state["name"] == "guard" and guard_ftz.flush_subnormals()


def synchronize() -> None:
    """Wait for queued device work (a no-op on the CPU backends)."""
    if _state["name"] == "cupy":
        import cupy
        cupy.cuda.Device().synchronize()


def use_device(index: int) -> None:
    """Make GPU ``index mod G`` (of the G visible) this thread's current device.

    CuPy only; a no-op on the CPU backends. Ranks started by ``minidist.launch``
    or ``minidist run`` call it with their rank, so they take the GPUs in turn
    and, with more ranks than GPUs, several share one. The current device is
    per thread in CUDA: a thread that works on a rank's arrays (the background
    thread of async collectives) calls it too, with ``current_device()``.
    """
    if _state["name"] == "cupy":
        import cupy
        cupy.cuda.Device(index % cupy.cuda.runtime.getDeviceCount()).use()


def cupy_unavailable() -> str | None:
    """Why ``MINIDIST_BACKEND=cupy`` cannot run here (no CuPy, no CUDA device), or None."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'minidist[cuda]')"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError / CUDADriverError: no driver, no device
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if count > 0 else "no CUDA device"


def device_name() -> str:
    """The current GPU's name as the driver reports it (CuPy), else "CPU"."""
    if _state["name"] != "cupy":
        return "CPU"
    import cupy
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_type() -> str:
    """torch's name for where the arrays live: "cuda" on CuPy and on the guard that
    imitates it (so a mesh made with "cpu" fails on the CPU too), else "cpu" (what
    ``init_device_mesh`` expects, as ``"cuda" if torch.cuda.is_available() else "cpu"``)."""
    return "cuda" if _state["name"] in ("cupy", "guard") else "cpu"


def current_device() -> int | None:
    """This thread's current GPU (CuPy), or None on the CPU backends."""
    if _state["name"] == "cupy":
        import cupy
        return cupy.cuda.Device().id
    return None


class Generator:
    """A seeded random generator that gives identical numbers on every backend.

    Draws happen on the host with NumPy's PCG64 and are copied to the active
    backend, so a run on CuPy sees the same initial weights and dropout masks
    as the same run on NumPy.
    """

    def __init__(self, seed: int | None = 0):
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def normal(self, size, mean: float = 0.0, std: float = 1.0, dtype="float32"):
        return from_host(self._rng.normal(mean, std, size).astype(dtype))

    def uniform(self, size, low: float = 0.0, high: float = 1.0, dtype="float32"):
        return from_host(self._rng.uniform(low, high, size).astype(dtype))

    def random(self, size, dtype="float32"):
        """Uniform on [0, 1)."""
        return from_host(self._rng.random(size, dtype=np.dtype(dtype)))

    def integers(self, low: int, high: int, size, dtype="int64"):
        return from_host(self._rng.integers(low, high, size, dtype=np.dtype(dtype)))

    def permutation(self, n: int):
        return from_host(self._rng.permutation(n))

    def get_state(self) -> dict:
        return self._rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        self._rng.bit_generator.state = state


# draws happen on the host, so one default generator serves every backend
_default_generator = Generator(0)


def default_generator() -> Generator:
    """The generator used when none is passed (dropout, weight init)."""
    return _default_generator


def manual_seed(seed: int) -> None:
    """Reseed the default generator (like ``torch.manual_seed``)."""
    global _default_generator
    _default_generator = Generator(seed)


set_backend(os.environ.get("MINIDIST_BACKEND", "numpy"))

# measuring on the active backend (measure.py), last: it uses what is defined above
from minidist.backend.measure import (MatmulFlopCounter, MemoryTracker, Timer,  # noqa: E402
                                      memory_in_use)
