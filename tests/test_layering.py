"""The package's layers import downwards only (DESIGN.md, "Layers").

Parses every module of ``minidist`` and checks each ``minidist.X`` import
against the table below. An upward import (``comm`` importing ``parallel``,
``nn`` importing ``comm``) fails with the file and line. No two modules import
each other, directly or round a circle, even lazily inside a function: a piece
both need goes to a module both import.
"""
import ast
import pathlib
import sys

import pytest

import minidist

pytestmark = pytest.mark.host_only  # text and source files: no backend array (tests/conftest.py)

# layer -> the layers it may import (besides itself)
ALLOWED = {
    "backend": set(),
    "calc": set(),
    "untrusted": set(),   # reading files a stranger wrote: imports nothing of the package
    "autograd": {"backend"},
    "precision": {"backend", "autograd"},
    "attention": {"backend", "autograd", "precision"},
    "nn": {"backend", "autograd", "precision", "attention"},
    "optim": {"backend", "autograd", "precision"},   # Muon's bf16 iteration rounds
    "comm": {"backend"},
    # the facade (distributed/__init__) imports only comm; beside it DTensor, the TP styles
    # and fully_shard build on autograd and nn, at the level of parallel (DESIGN.md)
    "distributed": {"backend", "autograd", "precision", "attention", "nn", "optim", "comm",
                    "launch"},
    "launch": {"backend", "comm", "distributed"},
    "parallel": {"backend", "autograd", "precision", "attention", "nn", "optim", "comm",
                 "distributed", "launch"},
    "checkpoint": {"backend", "autograd", "nn", "optim", "comm", "distributed", "parallel"},
    "selftest": {"backend", "autograd", "precision", "attention", "nn", "optim", "comm",
                 "distributed", "launch", "parallel"},
    "exercises": {"backend", "calc", "autograd", "precision", "attention", "nn", "optim", "comm",
                  "distributed", "launch", "parallel"},
    "trace": {"backend"},   # recording is below every layer that records into it
    "cli": None,        # the command line may import anything
    "__init__": None,   # the package's front door re-exports
}
# modules that may import numpy by name for array work (selftest: host inputs and the
# comparisons against NumPy; exercises: the learner's inputs and expected values)
NUMPY_OK = {"backend", "calc", "cli", "selftest", "exercises"}
# single modules that may: the checkpoint file format is NumPy's .npy, its leaves host arrays
NUMPY_OK_MODULES = {"checkpoint/tree.py", "checkpoint/records.py",
                    # compare reads two runs' host copies: ulps on the bits, the corpus
                    "parallel/compare/api.py", "parallel/compare/diff.py",
                    "parallel/compare/command.py"}

# Inside minidist.parallel, one strategy (a subpackage) may import another only where it
# builds on it. strategy -> the strategies it may import (besides itself); the modules at
# parallel/ level (three_d.py, diagnostics.py, clip.py)
# compose strategies and may import any.
STRATEGIES = {
    "data": set(),
    "zero": {"data"},               # ZeRO is data parallelism with shards: its buckets, broadcast
    "tensor": set(),
    "pipeline": set(),
    "context": set(),
    "expert": set(),
    "diloco": set(),                # a replica may be DDP / TP, but DiLoCo only sees a group
    "fault_tolerance": set(),       # a quorum over replicas; the replicas see only its group
    "compose": {"clip", "data", "tensor", "context", "expert", "pipeline"},   # every dimension
                                    # on one mesh: each strategy applied in torchtitan's order
    "compare": {"three_d", "compose", "data", "zero"},   # runs (and
                                    # times) the layouts 3D, DDP, ZeRO or the composition of
                                    # every dimension make
}
# Inside minidist.comm: transport moves bytes, collectives are built on it, the launcher
# starts worlds of it. package -> what it may import (the modules at comm/ level, group,
# mesh and errors, are what a user meets first and sit between them).
COMM_LAYERS = {
    "transport": {"errors"},
    "collectives": {"transport", "errors", "group"},
    "launch": {"transport", "errors", "group"},
}

for _layer, _allowed in ALLOWED.items():   # every layer may record into a trace
    if _allowed is not None and _layer not in ("backend", "calc", "trace", "untrusted"):
        _allowed.add("trace")
    if _allowed is not None and _layer not in ("calc", "untrusted"):  # and read files
        _allowed.add("untrusted")

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


def _sibling_violations(package: str, table: dict) -> list[str]:
    """Imports between subpackages of ``minidist.<package>`` that ``table`` does not allow.

    A module directly in the package (not in a subpackage) is free: it composes them.
    """
    found = []
    for path in _package_modules():
        parts = path.relative_to(ROOT).parts
        if parts[0] != package or len(parts) < 3:
            continue
        own = parts[1]
        for line, name in _imports(path):
            target = name.split(".")
            if target[:2] != ["minidist", package] or len(target) < 3 or target[2] == own:
                continue
            if target[2] not in table.get(own, set()):
                found.append(f"{path.relative_to(ROOT)}:{line} ({package}/{own}) imports {name}")
    return found


def test_strategies_import_only_what_they_build_on():
    wrong = _sibling_violations("parallel", STRATEGIES)
    assert not wrong, "strategy imports a sibling it does not build on:\n" + "\n".join(wrong)


def test_transport_is_below_the_collectives():
    wrong = _sibling_violations("comm", COMM_LAYERS)
    assert not wrong, "comm layer imports upward:\n" + "\n".join(wrong)


def test_every_strategy_and_comm_layer_is_in_its_table():
    for package, table in (("parallel", STRATEGIES), ("comm", COMM_LAYERS)):
        subpackages = {p.name for p in (ROOT / package).iterdir()
                       if p.is_dir() and (p / "__init__.py").exists()}
        assert subpackages == set(table), f"{package}: update the table for {subpackages ^ set(table)}"


def test_sibling_check_catches_a_forbidden_import(tmp_path, monkeypatch):
    """The sibling checker can fail: a data-parallel module that imports the pipeline."""
    fake = ROOT / "parallel" / "data" / "_fake_for_test.py"
    monkeypatch.setattr(sys.modules[__name__], "_package_modules", lambda: [fake])
    monkeypatch.setattr(pathlib.Path, "read_text",
                        lambda self, *a, **k: "from minidist.parallel.pipeline import gpipe\n")
    assert _sibling_violations("parallel", STRATEGIES) == [
        "parallel/data/_fake_for_test.py:1 (parallel/data) imports minidist.parallel.pipeline"]


def test_core_modules_take_arrays_from_the_backend():
    direct = []
    for path in _package_modules():
        if _layer_of(path) in NUMPY_OK or path.relative_to(ROOT).as_posix() in NUMPY_OK_MODULES:
            continue
        for line, name in _imports(path):
            if name == "numpy" or name.startswith("numpy.") or name == "cupy":
                direct.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not direct, "use minidist.backend.xp instead:\n" + "\n".join(direct)


def _module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


def _runtime_imports(path: pathlib.Path):
    """The modules ``path`` imports when it runs (at import or later, in a
    function), leaving out ``if TYPE_CHECKING:`` blocks (type hints only)."""
    def walk(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                yield from walk(node.orelse)
                continue
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield node.module
                yield from (f"{node.module}.{alias.name}" for alias in node.names)
            yield from walk(ast.iter_child_nodes(node))
    yield from walk(ast.parse(path.read_text(), filename=str(path)).body)


def import_circles(paths: list[pathlib.Path], name=_module_name) -> list[list[str]]:
    """The circles of the import graph between modules (package ``__init__``
    files, which are maps that re-export, are not nodes): each strongly
    connected component of more than one module, sorted. The op modules and
    tensor.py meet only through the ops package (tensor.py imports it at its
    end, each op imports Tensor when it runs), as torch's do."""
    modules = {name(p): p for p in paths if p.name != "__init__.py"}
    edges = {m: {t for t in _runtime_imports(p) if t in modules and t != m}
             for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:          # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


def test_no_two_modules_import_each_other():
    circles = import_circles(_package_modules())
    assert not circles, "import circles (move what both need to a module both import):\n" + \
        "\n".join(" <-> ".join(c) for c in circles)


def test_no_two_benchmarks_import_each_other():
    """bench/ imports its helpers by bare name (``from _args import ...``)."""
    bench = sorted((ROOT.parent / "bench").glob("*.py"))
    circles = import_circles(bench, name=lambda p: p.stem)
    assert not circles, "import circles in bench/:\n" + "\n".join(map(str, circles))


def test_the_circle_check_catches_a_circle(tmp_path, monkeypatch):
    """The circle checker can fail: two fake modules that import each other lazily."""
    a, b = ROOT / "parallel" / "_fake_a.py", ROOT / "parallel" / "_fake_b.py"
    text = {a: "def f():\n    from minidist.parallel import _fake_b\n",
            b: "from minidist.parallel._fake_a import f\n"}
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *x, **k: text[self])
    assert import_circles([a, b]) == [["minidist.parallel._fake_a", "minidist.parallel._fake_b"]]


def test_layering_check_catches_an_upward_import(tmp_path):
    """The checker itself can fail: feed it a fake upward import."""
    fake = tmp_path / "fake.py"
    fake.write_text("from minidist.parallel import ddp\n")
    names = [name for _, name in _imports(fake)]
    assert "minidist.parallel" in names
