"""Tied parameters: one Parameter that two modules hold, each holder knowing the other.

    tie(model, "lm_head.weight", "wte.weight")   # model.lm_head.weight = model.wte.weight

GPT's output layer computes with its embedding's matrix (Llama's
``tie_word_embeddings``). A tool given one holder alone cannot see the other:
``parallelize_module(model.lm_head, mesh, ColwiseParallel())`` replaced
``lm_head.weight`` by its (V/tp, C) piece while ``wte.weight`` stayed the whole
(V, C) matrix, and the two copies trained apart without an error. So ``tie`` records,
on each holder, the other holder and both names from the model's root, and
``ties_leaving(module)`` lists the ties whose other holder lies outside ``module``
and still holds the same Parameter (a tie undone by assigning another Parameter
is no longer one).
"""
from __future__ import annotations

from typing import Any, NamedTuple

from minidist.nn.module import Module


class Tie(NamedTuple):
    """``module.<attr>`` (named ``name`` from the root) is ``other.<other_attr>``
    (named ``other_name``)."""
    module: Module
    attr: str
    name: str
    other: Module
    other_attr: str
    other_name: str


def _holder(root: Module, name: str) -> tuple[Module, str]:
    path, _, attr = name.rpartition(".")
    return dict(root.named_modules())[path], attr


def tie(root: Module, name: str, source: str) -> None:
    """Make ``root.<name>`` the Parameter ``root.<source>`` (dotted paths) and record
    the tie on both holders."""
    module, attr = _holder(root, name)
    other, other_attr = _holder(root, source)
    setattr(module, attr, getattr(other, other_attr))
    module.__dict__.setdefault("_ties", []).append(
        Tie(module, attr, name, other, other_attr, source))
    other.__dict__.setdefault("_ties", []).append(
        Tie(other, other_attr, source, module, attr, name))


def ties_leaving(module: Module) -> list[Tie]:
    """The ties of ``module``'s parameters (its own and its submodules') whose other
    holder is not among ``module``'s submodules and still holds the same Parameter."""
    inside = {id(m) for m in module.modules()}
    found = []
    for m in module.modules():
        for t in m.__dict__.get("_ties", ()):
            held = m._parameters.get(t.attr)
            if (held is not None and id(t.other) not in inside
                    and t.other._parameters.get(t.other_attr) is held):
                found.append(t)
    return found
