"""A tied weight belongs to one unit: a second unit cutting it is refused.

GPT's ``wte.weight`` is also ``lm_head.weight`` (Llama's ``tie_word_embeddings``). A
unit replaces a parameter by its pieces only where the unit's own modules use it, so

    fully_shard(model.lm_head)      # lm_head.weight -> pieces; wte.weight still whole
    fully_shard(model)              # wte.weight -> other pieces, of the same matrix

leaves two copies of one matrix, each with half the gradient, stepped apart: the tie
comes undone without an error (4e-2 from one process after two AdamW steps). Sharded
in one unit (``fully_shard(model)`` holding both), the unit's ``uses`` list both modules,
they compute with the one gathered matrix, and their gradients add up in it.

So each unit records the parameters it cut, held weakly: once the pieces replace a
parameter everywhere, nothing keeps it alive, and only a use outside the unit (the
other half of a tie) can bring it to a second ``fully_shard``, which raises.
"""
from __future__ import annotations

import weakref

from minidist.nn.module import Module, Parameter

# id(parameter a unit has cut) -> (the parameter, held weakly; the unit that cut it)
_cut_by: dict[int, tuple[weakref.ref, str]] = {}


def _note_cut(param: Parameter, unit: str) -> None:
    key = id(param)
    _cut_by[key] = (weakref.ref(param, lambda _: _cut_by.pop(key, None)), unit)


def _unit_that_cut(param: Parameter) -> str | None:
    found = _cut_by.get(id(param))
    return found[1] if found is not None and found[0]() is param else None


def refuse_split_ties(module: Module, managed: dict, names: dict[int, str]) -> None:
    """Raise if a parameter of ``managed`` (id -> (parameter, uses), those ``module``'s
    unit is about to cut) was cut by another unit; else record them as this unit's."""
    for param, uses in managed.values():
        first = _unit_that_cut(param)
        if first is not None:
            unit = f"the unit of {type(module).__name__} (as {names.get(id(param), uses[0][1])})"
            raise ValueError(
                f"fully_shard: a parameter shared by two modules (tied weights) is cut by two "
                f"units, {first} and {unit}; each would step its own copy and the "
                "tie would come undone. Shard the modules that share it in one unit: call "
                "fully_shard on a module holding both (the root, as torchtitan does for a "
                "tied embedding and output layer), not on either alone")
    for param, uses in managed.values():
        _note_cut(param, f"the unit of {type(module).__name__} (as {uses[0][1]})")
