"""Whether operations record a graph for backward (``no_grad``, ``enable_grad``).

The switch is per thread, as in PyTorch: a background thread that runs a
collective never sees the main thread's ``no_grad``.
"""
from __future__ import annotations

import threading

_local = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_local, "enabled", True)


def set_grad_enabled(mode: bool) -> None:
    _local.enabled = bool(mode)


class _GradMode:
    _mode: bool

    def __enter__(self):
        self._prev = is_grad_enabled()
        set_grad_enabled(self._mode)
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._prev)

    def __call__(self, fn):
        """Use as a decorator too: ``@no_grad()``."""
        def wrapped(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        wrapped.__name__ = getattr(fn, "__name__", "fn")
        wrapped.__doc__ = getattr(fn, "__doc__", None)
        return wrapped


class no_grad(_GradMode):
    """Context in which operations build no graph (inference, optimizer steps)."""
    _mode = False


class enable_grad(_GradMode):
    """Context that turns graph recording back on (used by checkpoint recompute)."""
    _mode = True
