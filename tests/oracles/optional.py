"""The optional oracles: what each comparison needs installed, and a skip that says so.

The README's test command installs the ``test`` extra (pytest, hypothesis, ml_dtypes,
safetensors, transformers) and nothing more. PyTorch and torchao are oracles a user
may add (``pip install torch torchao``); a transformers *model* needs PyTorch too, as
transformers imports without it but builds no model. Every test that needs one of them
asks through ``require`` here, so where it is absent the test skips with the command
that would make it run, and nowhere else does the suite import them unguarded.

``MINIDIST_HIDE_ORACLES`` makes a machine that has them look like one that has not
(CI runs one of its two passes so, and a test that imports torch without asking here
fails there): ``1`` hides them on every pass, a backend's name (``guard``) only on the
pass that tests that backend. Hiding is ``sys.modules[name] = None``: ``import torch``
then raises ModuleNotFoundError and ``importlib.util.find_spec("torch")`` is None, which
is how transformers decides that PyTorch is absent.
"""
from __future__ import annotations

import os
import sys
from types import ModuleType

import pytest

# the module the comparison imports -> what to install for it
INSTALL = {
    "torch": "pip install torch",
    "torchao": "pip install torch torchao",
}
HIDDEN = tuple(INSTALL)  # the oracles MINIDIST_HIDE_ORACLES hides


def require(name: str) -> ModuleType:
    """The module ``name`` (``torch``, ``torchao``, ``torch.distributed...``), or a skip
    of the calling test naming the package to install."""
    top = name.split(".")[0]
    return pytest.importorskip(name, reason=f"needs {top} ({INSTALL[top]})")


def require_transformers_model() -> ModuleType:
    """transformers, where it can build a model: with PyTorch beside it."""
    require("torch")
    return pytest.importorskip(
        "transformers", reason="needs transformers (pip install -e '.[test]')")


def hide_if_asked(backend_name: str) -> tuple[str, ...]:
    """Hide the optional oracles if ``MINIDIST_HIDE_ORACLES`` asks for this pass;
    return the names hidden."""
    asked = os.environ.get("MINIDIST_HIDE_ORACLES", "")
    if asked not in ("1", backend_name):
        return ()
    early = [name for name in HIDDEN if name in sys.modules]
    if early:
        raise RuntimeError(f"MINIDIST_HIDE_ORACLES: {', '.join(early)} was imported before "
                           "the suite's conftest could hide it")
    for name in HIDDEN:
        sys.modules[name] = None  # import raises ModuleNotFoundError; find_spec is None
    return HIDDEN
