"""The package reads like the textbook it is (STYLE.md, "Habits to absorb").

Beside the layering test (test_layering.py: imports point down, no import circle
counting imports inside functions), these hold the shape of the code:

- a function fits on a screen: at most 50 lines, its docstring included;
- a file holds one idea: at most 350 lines;
- ``parallel/`` and ``comm/`` are one folder per idea, with at most three modules
  beside the folders (what composes the strategies; what a user meets first);
- shared code asks a question of its input through one predicate owned by the
  module of the concept, never by probing for an attribute: "this block routes
  tokens" is ``nn.moe.routes_tokens``, "does the loss add a balancing term"
  ``nn.moe.adds_balancing_loss``, and the planner's calibration to this
  machine (``implementation == "minidist"``) lives in one file of its own; an MoE
  block's loss term is a named function (``nn.moe.layer_loss``), not a field's name;
- a strategy reads a model's sizes through one record, ``config.dims()``
  (nn/decoder.py): the Llama's config keeps Hugging Face's names, no alias of the GPT's;
- state has names: no module-level one-item list used as a global cell
  (``PHASE = ["forward"]`` ... ``PHASE[0] = "backward"``); an object with named
  fields holds it (``_collectives.OBSERVED.phase``);
- code outside ``autograd/`` joins a backward through its named hook points
  (``Context.register_prehook`` / ``register_hook``, ``autograd.hooks.on_gradient``):
  it builds no graph node by hand (``Context()``, ``Tensor._from_op``), swaps no
  node's ``fn`` and makes no class with ``type(name, bases, body)``; and the trace of
  modules keeps no module-level table (its state is the recorder's ``ModuleTrace``);
- inside ``autograd/`` no file imports another's private names: what two files
  share is a public, named piece (the engine's ``LeafGradients``, ``run_graph``).
- the trace of modules asks its callers' questions through named functions
  (``weight_grad.in_b_pass()``, ``Module.values_in_use()``): no ``getattr`` /
  ``hasattr`` probe, no read of another module's global;
- no private name (a function or value, ``_note``) is imported from a file of
  another folder: what crosses a folder is public.

The learner's exercises (``exercises/``) are left out: their solutions are meant
to be read whole.
"""
import ast
import pathlib
import re

import pytest

import minidist

pytestmark = pytest.mark.host_only  # text and source files: no backend array (tests/conftest.py)

ROOT = pathlib.Path(minidist.__file__).parent
MAX_FUNCTION_LINES = 50
MAX_FILE_LINES = 350
EXEMPT = {"exercises"}          # top-level folders of minidist/ left out
MAX_TOP_MODULES = 3             # modules beside the folders of parallel/ and comm/
FOLDERED = ("parallel", "comm")
# text that may appear in one file only: pattern -> the file (relative to minidist/)
OWNED = {
    r"hasattr\([^)]*[\"']aux_loss[\"']\)": None,          # ask nn.moe.routes_tokens instead
    r"implementation\s*==\s*[\"']minidist[\"']": "calc/planner/calibration.py",
    r"run_block\([^)]*[\"']": None,     # a routing's term is a named function, not a field name
    # "does the loss add a balancing term": nn.moe.adds_balancing_loss, not the Llama's field
    r"(getattr|hasattr)\([^)]*[\"'](router_aux_loss_coef|moe_layers)[\"']": None,
}
# the recording in progress: the recorder's public handle, read as ``trace.active``
PUBLIC_STATE = {("trace", "active")}
# private names that still cross a folder: file (relative to minidist/) -> names
CROSSING_LEFT = {"parallel/fault_tolerance/quorum.py": {"_row_major"}}  # device_mesh's index


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] not in EXEMPT)


def long_functions(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line name (n lines)`` for each function longer than the limit (from its
    ``def`` to its last line, the docstring included; decorators not)."""
    tree = ast.parse(path.read_text() if text is None else text)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                             f"({lines} lines)")
    return found


def private_imports(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line name`` for each private name (``_x``) imported from another module."""
    tree = ast.parse(path.read_text() if text is None else text)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}")
    return found


def _is_module(dotted: str) -> bool:
    """Whether ``minidist.a.b`` names a module or package of the package (not a name in one)."""
    rel = pathlib.Path(*dotted.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def crossing_imports(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line name`` for each private name that is not a module (``from x import _f``)
    imported from a file of another folder of minidist/."""
    tree = ast.parse(path.read_text() if text is None else text)
    here = path.parent.relative_to(ROOT).parts
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("minidist.")):
            continue
        source = node.module.split(".")[1:]
        folder = tuple(source if (ROOT / pathlib.Path(*source)).is_dir() else source[:-1])
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if private and folder != here and not _is_module(f"{node.module}.{alias.name}"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}")
    return found


def peeks(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line what`` for each question asked by peeking: a ``getattr`` / ``hasattr``
    call, or a read of an imported module's attribute that is not called (its global,
    as ``weight_grad.splitting``), but for the recorder's ``trace.active``."""
    tree = ast.parse(path.read_text() if text is None else text)
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minidist"):
            modules.update(a.asname or a.name for a in node.names
                           if _is_module(f"{node.module}.{a.name}"))
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr",
                                                                              "hasattr"):
            what = f"{node.func.id}(...)"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in modules and id(node) not in called \
                and (node.value.id, node.attr) not in PUBLIC_STATE:
            what = f"{node.value.id}.{node.attr}"
        if what:
            found.append((node.lineno, f"{path.relative_to(ROOT)}:{node.lineno} {what}"))
    return [f for _, f in sorted(found)]


def global_cells(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line NAME`` where an item of a module-level one-item list is assigned."""
    tree = ast.parse(path.read_text() if text is None else text)
    cells = {t.id for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.List) and len(node.value.elts) == 1
             for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign) else []
        for t in targets:
            if isinstance(t, ast.Subscript) and getattr(t.value, "id", None) in cells:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {t.value.id}")
    return found


def graph_surgery(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line what`` for each graph node built or altered by hand: a ``Context()``,
    a ``._from_op(...)``, an assignment to a ``.fn``, a three-argument ``type(...)``."""
    tree = ast.parse(path.read_text() if text is None else text)
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("Context", "_from_op") or (name == "type" and len(node.args) == 3):
                what = f"{name}(...)"
        elif isinstance(node, ast.Assign):
            targets = [e for t in node.targets
                       for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(isinstance(e, ast.Attribute) and e.attr == "fn" for e in targets):
                what = ".fn = ..."
        if what:
            found.append((node.lineno, f"{path.relative_to(ROOT)}:{node.lineno} {what}"))
    return [f for _, f in sorted(found)]


def module_tables(path: pathlib.Path, text: str | None = None) -> list[str]:
    """``path:line name`` for each module-level dict, list or set (a table kept by the
    module rather than by the object whose lifetime it shares)."""
    tree = ast.parse(path.read_text() if text is None else text)
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        called = getattr(value.func, "id", "") if isinstance(value, ast.Call) else ""
        if isinstance(value, (ast.Dict, ast.List, ast.Set)) or called in ("dict", "list", "set"):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {getattr(target, 'id', '?')}")
    return found


def test_no_function_is_longer_than_a_screen():
    found = [f for path in _modules() for f in long_functions(path)]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split them into their " \
        "named steps):\n" + "\n".join(found)


def test_no_file_holds_more_than_one_idea():
    found = [f"{p.relative_to(ROOT)} ({n} lines)" for p in _modules()
             if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not found, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(found)


def top_modules(folder: pathlib.Path) -> list[str]:
    """The modules of ``folder`` beside its subpackages (its ``__init__`` left out)."""
    return sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")


def test_parallel_and_comm_are_one_folder_per_idea():
    found = [f"{name}/: {top_modules(ROOT / name)}" for name in FOLDERED
             if len(top_modules(ROOT / name)) > MAX_TOP_MODULES]
    assert not found, f"more than {MAX_TOP_MODULES} modules beside the folders (move each " \
        "into the folder of its idea):\n" + "\n".join(found)


def test_each_question_is_asked_in_one_place():
    found = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        for pattern, owner in OWNED.items():
            if rel != owner and re.search(pattern, text):
                found.append(f"{rel}: {pattern} (belongs in {owner or 'a named predicate'})")
    assert not found, "\n".join(found)


def test_the_owned_questions_have_their_owners():
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    from minidist.nn.moe import MoE, adds_balancing_loss, routes_tokens
    assert routes_tokens(MoE(8, 2)) and not routes_tokens(object())
    gpt = dict(vocab_size=16, block_size=4, n_layer=2, n_head=2, n_embd=8, n_expert=2,
               moe_every=1)
    llama = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4,
                 num_local_experts=2, num_experts_per_tok=1)
    assert adds_balancing_loss(GPT(GPTConfig(**gpt)))
    assert not adds_balancing_loss(GPT(GPTConfig(**gpt, moe_aux_coef=0.0, moe_bias_rate=0.1)))
    assert adds_balancing_loss(Llama(LlamaConfig(**llama, router_aux_loss_coef=0.01)))
    assert not adds_balancing_loss(Llama(LlamaConfig(**llama)))
    assert not adds_balancing_loss(Llama(LlamaConfig(**{**llama, "num_local_experts": 0},
                                                     router_aux_loss_coef=0.01)))
    for owner in OWNED.values():
        assert owner is None or (ROOT / owner).exists(), owner


def test_state_is_named_not_a_list_cell():
    found = [f for path in _modules() for f in global_cells(path)]
    assert not found, "one-item lists used as globals (name the state):\n" + "\n".join(found)


def test_strategies_read_sizes_through_one_record():
    from minidist.nn import GPTConfig, LlamaConfig
    from minidist.nn.decoder import DecoderDims
    gpt = GPTConfig(block_size=8, n_layer=3, n_head=2, n_embd=8, tie_weights=False)
    llama = LlamaConfig(max_position_embeddings=8, num_hidden_layers=3, num_attention_heads=2,
                        hidden_size=8, tie_word_embeddings=False)
    assert gpt.dims() == llama.dims() == DecoderDims(8, 3, 2, 8, False)
    aliases = [name for name in DecoderDims._fields + tuple(GPTConfig.__dataclass_fields__)
               if name in dir(LlamaConfig) and name not in LlamaConfig.__dataclass_fields__]
    assert not aliases, f"LlamaConfig aliases {aliases}: read config.dims() instead"


def test_backward_is_joined_through_named_hooks():
    found = [f for path in _modules() if path.relative_to(ROOT).parts[0] != "autograd"
             for f in graph_surgery(path)]
    found += module_tables(ROOT / "nn" / "module_trace.py")
    assert not found, "graph nodes built or altered by hand, or module-level tables:\n" + \
        "\n".join(found)


def test_autograd_files_share_only_public_names():
    found = [f for path in sorted((ROOT / "autograd").rglob("*.py"))
             for f in private_imports(path)]
    assert not found, "private names imported across files in autograd/:\n" + "\n".join(found)


def test_the_module_trace_asks_named_questions():
    found = peeks(ROOT / "nn" / "module_trace.py")
    assert not found, "the trace of modules peeks at its callers (ask a named function of " \
        "the module that owns the state):\n" + "\n".join(found)


def test_no_private_name_crosses_a_folder():
    found = [f for path in _modules() for f in crossing_imports(path)
             if f.split(" ")[1] not in CROSSING_LEFT.get(f.split(":")[0], ())]
    assert not found, "private names imported from another folder (make them public):\n" + \
        "\n".join(found)


def test_the_checks_can_fail():
    """Each checker finds what it looks for in a fake module."""
    fake = ROOT / "autograd" / "_fake.py"
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(fake, f"def f():\n{body}\n") == \
        [f"autograd/_fake.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(fake, "def f():\n    pass\n") == []
    assert private_imports(fake, "from minidist.autograd.engine import _run, call_backward\n") \
        == ["autograd/_fake.py:1 _run"]
    assert top_modules(ROOT / "comm" / "collectives") != [] and \
        len(top_modules(ROOT / "comm" / "collectives")) > MAX_TOP_MODULES
    assert global_cells(fake, 'PHASE = ["forward"]\ndef f():\n    PHASE[0] = "b"\n') == \
        ["autograd/_fake.py:3 PHASE"]
    assert global_cells(fake, 'SIZES = [1]\ndef f(x):\n    x[0] = 2\n') == []
    assert [f.split(" ", 1)[1] for f in graph_surgery(fake, "ctx = Context()\n"
            "y = Tensor._from_op(x, ctx, 0)\nout._ctx.fn, out._ctx.name = timed(f), 'n'\n"
            "cls = type('B', (A,), {})\n")] == ["Context(...)", "_from_op(...)", ".fn = ...",
                                                "type(...)"]
    assert graph_surgery(fake, "node.register_prehook(start)\nkind = type(x)\n") == []
    assert module_tables(fake, "_timed: dict[type, type] = {}\nA = dict()\nN = 3\n") == \
        ["autograd/_fake.py:1 _timed", "autograd/_fake.py:2 A"]
    pattern = next(iter(OWNED))
    assert re.search(pattern, 'if hasattr(block.mlp, "aux_loss"):')
    assert re.search(list(OWNED)[2], 'x, aux = run_block(block, moe, x, "aux_loss", False)')
    assert not re.search(list(OWNED)[2], 'x, aux = run_block(block, moe, x, layer_loss, False)')
    assert re.search(list(OWNED)[3], 'pooled = getattr(model.config, "router_aux_loss_coef", 0)')
    assert re.search(list(OWNED)[3], 'moes = model.moe_layers() if hasattr(model, "moe_layers")')
    assert not re.search(list(OWNED)[3], "if adds_balancing_loss(model):")
    nn_file = ROOT / "nn" / "_fake.py"
    assert [f.split(" ", 1)[1] for f in peeks(nn_file, "from minidist.autograd import weight_grad"
            "\nif weight_grad.splitting:\n    p = getattr(m, n, None)\n")] == \
        ["weight_grad.splitting", "getattr(...)"]
    assert peeks(nn_file, "from minidist.autograd import weight_grad\n"
                 "from minidist.trace import recorder as trace\n"
                 "x = weight_grad.in_b_pass() and trace.active\n") == []
    assert crossing_imports(nn_file, "from minidist.distributed.tensor._collectives import "
                            "_note, OBSERVED\nfrom minidist.nn.module import _x\n"
                            "from minidist.distributed.tensor import _collectives\n") == \
        ["nn/_fake.py:1 _note"]
