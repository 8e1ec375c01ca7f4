"""How a function travels to the ranks: dill, with every importable module by reference.

``World.run(fn, *args)`` pickles ``(fn, args, kwargs)`` with dill and ``recurse=True``,
so that a function defined in a script's ``__main__`` or in a notebook cell (which the
ranks cannot import) travels by value, with the globals it uses: a module-level helper,
a constant. dill saves a module it counts as the user's own (any module outside
site-packages and the standard library: minidist itself in an editable install, a
module beside the script) by value too, its whole ``__dict__``, and that fails on the
first thread-local or lock inside (``import minidist`` then ``minidist.tensor(...)`` in
the function: ``cannot pickle '_thread._local' object``). Here a module the ranks can
import (not ``__main__``, registered in ``sys.modules`` under its name, loaded from a
spec) is saved by its name; the ranks start from this process's ``sys.path`` (the
spawn start method sends it), so they find it. A package of the user's own comes with
the names of its submodules imported here (``minidist.distributed``, once anything
imported it), so that ``minidist.distributed.get_rank()`` in the function finds on a
rank what it found here. Everything else is dill's.
"""
from __future__ import annotations

import importlib
import io
import sys
from types import ModuleType
from typing import Any

import dill


def importable(module: ModuleType) -> bool:
    """Can a rank get this module by importing its name?"""
    name = module.__name__
    return (name != "__main__" and sys.modules.get(name) is module
            and getattr(module, "__spec__", None) is not None)


def _by_name(name: str, submodules: list[str]) -> ModuleType:
    """On the rank: the module, after importing the submodules it had here."""
    for sub in submodules:
        importlib.import_module(sub)
    return importlib.import_module(name)


def _loaded_submodules(module: ModuleType) -> list[str]:
    """The submodules of a package of the user's own that are imported here. Installed
    packages (numpy, torch) travel by name alone, as dill sends them."""
    if not hasattr(module, "__path__") or dill._dill._is_builtin_module(module):
        return []
    prefix = module.__name__ + "."
    return sorted(name for name, sub in list(sys.modules.items())
                  if name.startswith(prefix) and sub is not None and importable(sub))


class _ModulesByReference(dill.Pickler):
    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, ModuleType) and importable(obj) and id(obj) not in self.memo:
            self.save_reduce(_by_name, (obj.__name__, _loaded_submodules(obj)), obj=obj)
            return
        super().save(obj, save_persistent_id)


def dumps(obj: Any) -> bytes:
    """``dill.dumps(obj, recurse=True)``, importable modules by reference."""
    buffer = io.BytesIO()
    _ModulesByReference(buffer, recurse=True).dump(obj)
    return buffer.getvalue()
