"""What an exercise is, where the learner's code lives, and how it is graded.

An ``Exercise`` carries the starter file written into the learner's workspace,
the properties that grade it, and hints that point at the docs (never at the
solution). A ``Property`` is a plain function ``check(subject, **drawn)`` that
raises ``AssertionError`` when the subject is wrong, with the hypothesis
strategies that draw its inputs. "One suite, two subjects": the same property
runs against the learner's module (``minidist exercise check``) and against the
library's implementation (the project's tests), through ``Subject``.

Multi-process properties run the subject on a ``World`` of real processes
(``Subject.run``). Every world has a timeout: a learner's receive that waits
for a message that never comes raises ``CommTimeoutError`` in that rank after
``COMM_TIMEOUT_S``, and the check reports the hang instead of waiting forever.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import pathlib
import sys
import types
from typing import Any, Callable

COMM_TIMEOUT_S = 3.0    # a send or receive that waits longer than this is a hang
RUN_TIMEOUT_S = 30.0    # one call on a world (catches a learner's endless loop)
KINDS = ("implement", "debug", "derive")


@dataclasses.dataclass
class Property:
    """One graded property: ``check(subject, **drawn)`` raises AssertionError if it fails.

    ``given``: hypothesis strategies by argument name (empty: run once);
    ``hint``: where in the docs to look, never the answer; ``explicit``: cases
    tried before the drawn ones (the case the docs warn about).
    """
    name: str
    check: Callable[..., None]
    given: dict = dataclasses.field(default_factory=dict)
    hint: str = ""
    examples: int = 15
    explicit: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Exercise:
    """An implement or debug exercise (derive exercises are in derive.py).

    ``solution``: a module source that satisfies the interface with the
    library's own implementation; ``wrong``: named wrong versions. The tests
    check that the first passes and each of the others fails.
    """
    id: str
    title: str
    kind: str
    filename: str
    starter: str
    properties: list[Property]
    solution: str
    wrong: dict[str, str]
    docs: str = ""
    fixed: str = ""         # a debug exercise: the starter with only its planted bug fixed
    processes: bool = False  # graded on worlds of real processes (seconds per property)

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind


# --------------------------------------------------------------------------
# The subject: the module under test, in this process and on a world of ranks.
# --------------------------------------------------------------------------

_loaded: dict[tuple[str, float], types.ModuleType] = {}


def load_module(spec: str) -> types.ModuleType:
    """A module by file path (the learner's) or by dotted name (the library's)."""
    if not spec.endswith(".py"):
        return importlib.import_module(spec)
    path = pathlib.Path(spec)
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _loaded:
        name = "minidist_exercise_" + path.stem
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module          # dataclasses and pickling look modules up by name
        module_spec.loader.exec_module(module)
        _loaded[key] = module
    return _loaded[key]


class Subject:
    """The implementation a property grades: a file path or an importable module name."""

    def __init__(self, spec: str | pathlib.Path):
        self.spec = str(spec)

    @property
    def module(self) -> types.ModuleType:
        return load_module(self.spec)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(self.module, name)
        except AttributeError:
            raise AssertionError(f"the module defines no {name!r}: keep the name and "
                                 "signature of the starter file") from None

    def run(self, world_size: int, driver: Callable, *args: Any) -> list:
        """``driver(module, *args)`` on ``world_size`` ranks; the per-rank results.

        ``driver`` is a module-level function of an exercise file (it reaches the
        ranks by reference). A rank that raises or hangs stops the world and the
        property with ``Stop`` (hangs and missing code are not shrunk).
        """
        from minidist.comm.errors import RankFailedError
        world = _world(world_size)
        try:
            return world.run(_in_rank, self.spec, driver, args)
        except RankFailedError as e:
            tail = e.remote_traceback.strip().splitlines()
            if e.exc_type == "AssertionError":
                raise AssertionError(f"rank {e.rank}: {tail[-1]}") from None
            if e.exc_type == "NotImplementedError":
                raise Stop("not implemented yet: the body still raises NotImplementedError")
            if e.exc_type in ("CommTimeoutError", "TimeoutError"):
                # the error's own lines: what the rank waited on, then the flight
                # recorder's table (every rank's last call)
                first = next((i for i, line in enumerate(tail)
                              if line.startswith(("minidist.comm.errors.CommTimeoutError",
                                                  "CommTimeoutError", "TimeoutError"))),
                             len(tail) - 3)
                raise Stop(f"rank {e.rank} hung (world of {world_size}); the world was "
                           f"stopped after its timeout:\n    "
                           + "\n    ".join(line.replace("minidist.comm.errors.", "")
                                            for line in tail[first:first + 12]))
            raise Stop(f"rank {e.rank} raised {e.exc_type} (world of {world_size}):\n    "
                       + "\n    ".join(tail[-6:]))


def _in_rank(spec: str, driver: Callable, args: tuple) -> Any:
    return driver(load_module(spec), *args)


class Stop(BaseException):
    """Ends a property at once, without shrinking: a hang, a crash in a rank, or
    code not written yet. A BaseException so that hypothesis does not catch it."""


_worlds: dict[int, Any] = {}
_sharing = {"on": False, "timeout": COMM_TIMEOUT_S}


def _world(n: int):
    from minidist.comm import World
    world = _worlds.get(n)
    if world is None or world.closed:
        world = _worlds[n] = World(n, timeout=_sharing["timeout"], run_timeout=RUN_TIMEOUT_S)
    return world


def close_worlds(unless_shared: bool = False) -> None:
    """Stop every world a check started (the check calls it at the end)."""
    if unless_shared and _sharing["on"]:
        return
    while _worlds:
        _, world = _worlds.popitem()
        world.close()


@contextlib.contextmanager
def shared_worlds(timeout: float = COMM_TIMEOUT_S):
    """Checks inside share their worlds (one start per world size, not one per
    check), with this receive timeout; every world is closed at the end."""
    before = dict(_sharing)
    close_worlds()
    _sharing.update(on=True, timeout=timeout)
    try:
        yield
    finally:
        _sharing.update(on=False)
        close_worlds()
        _sharing.update(before)     # an enclosing shared_worlds() goes on
