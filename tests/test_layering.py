"""The package's layers import downwards only (DESIGN.md, "Layers").

Parses every module of ``minidist`` and checks each ``minidist.X`` import
against the table below. An upward import (``comm`` importing ``parallel``,
``nn`` importing ``comm``) fails with the file and line.
"""
import ast
import pathlib

import minidist

# layer -> the layers it may import (besides itself)
ALLOWED = {
    "backend": set(),
    "calc": set(),
    "autograd": {"backend"},
    "precision": {"backend", "autograd"},
    "attention": {"backend", "autograd", "precision"},
    "nn": {"backend", "autograd", "precision", "attention"},
    "optim": {"backend", "autograd"},
    "comm": {"backend"},
    "distributed": {"backend", "comm"},
    "launch": {"backend", "comm", "distributed"},
    "parallel": {"backend", "autograd", "precision", "attention", "nn", "optim", "comm",
                 "distributed", "launch"},
    "checkpoint": {"backend", "autograd", "nn", "optim", "comm", "distributed", "parallel"},
    "selftest": {"backend", "autograd", "precision", "attention", "nn", "optim", "comm",
                 "distributed", "launch", "parallel"},
    "cli": None,        # the command line may import anything
    "__init__": None,   # the package's front door re-exports
}
# modules that may import numpy by name for array work (selftest: host inputs and the
# comparisons against NumPy)
NUMPY_OK = {"backend", "calc", "cli", "selftest"}

ROOT = pathlib.Path(minidist.__file__).parent


def _layer_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return rel.parts[0]


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            if node.module == "minidist":  # from minidist import backend, nn, ...
                for alias in node.names:
                    yield node.lineno, f"minidist.{alias.name}"


def _package_modules():
    return sorted(p for p in ROOT.rglob("*.py"))


def test_every_module_belongs_to_a_known_layer():
    unknown = {_layer_of(p) for p in _package_modules()} - set(ALLOWED)
    assert not unknown, f"add these to the layer table in {__file__}: {unknown}"


def test_imports_point_down_only():
    upward = []
    for path in _package_modules():
        layer = _layer_of(path)
        allowed = ALLOWED.get(layer)
        if allowed is None:
            continue
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "minidist" or len(parts) < 2:
                continue
            target = parts[1]
            if target in ALLOWED and target != layer and target not in allowed:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({layer}) imports {name}")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_core_modules_take_arrays_from_the_backend():
    direct = []
    for path in _package_modules():
        if _layer_of(path) in NUMPY_OK:
            continue
        for line, name in _imports(path):
            if name == "numpy" or name.startswith("numpy.") or name == "cupy":
                direct.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not direct, "use minidist.backend.xp instead:\n" + "\n".join(direct)


def test_layering_check_catches_an_upward_import(tmp_path):
    """The checker itself can fail: feed it a fake upward import."""
    fake = tmp_path / "fake.py"
    fake.write_text("from minidist.parallel import ddp\n")
    names = [name for _, name in _imports(fake)]
    assert "minidist.parallel" in names
