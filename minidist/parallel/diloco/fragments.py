"""Which parameters each fragment of DiLoCo synchronises, and the check on its optimizers.

Every parameter of the model is in exactly one fragment (the whole model is one
fragment in plain DiLoCo). A frozen parameter (``requires_grad=False`` when DiLoCo is
built, the same on every replica) has no outer gradient: it is left out of its
fragment, so no byte of it travels in the outer all-reduce and the outer optimizer
(its weight decay, its momentum) never steps it. The outer optimizer holds every
trainable parameter of the model, and may hold the frozen ones.
"""
from __future__ import annotations

from typing import Any, Sequence

from minidist.nn import Module


def trained_fragment_params(model: Module, fragments: Sequence[Any] | None) -> list[list]:
    """Each fragment's trainable parameters in model order (None: the whole model)."""
    groups = [list(model.parameters())] if fragments is None \
        else fragment_params(model, fragments)
    return [[p for p in ps if p.requires_grad] for ps in groups]


def fragment_params(model: Module, fragments: Sequence[Any]) -> list[list]:
    """Each fragment's parameters in model order; every parameter in exactly one."""
    if len(fragments) == 0:
        raise ValueError("fragments is empty: pass None (the whole model) or a list of "
                         "Modules / lists of Modules")
    owner: dict[int, int] = {}
    for f, frag in enumerate(fragments):
        modules = [frag] if isinstance(frag, Module) else list(frag)
        for m in modules:
            if not isinstance(m, Module):
                raise TypeError(f"fragment {f} holds a {type(m).__name__}; a fragment is a "
                                "Module or a list of Modules")
            for p in m.parameters():
                if id(p) in owner and owner[id(p)] != f:
                    raise ValueError(f"a parameter is in fragments {owner[id(p)]} and {f}: "
                                     "each parameter must be in exactly one fragment")
                owner[id(p)] = f
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [names[i] for i in names if i not in owner]
    if missing:
        raise ValueError(f"parameters {missing} are in no fragment: add the modules that "
                         "hold them to a fragment")
    foreign = [i for i in owner if i not in names]
    if foreign:
        raise ValueError(f"fragments hold {len(foreign)} parameter(s) that are not the "
                         "model's: build fragments from the model's own submodules")
    groups: list[list] = [[] for _ in fragments]
    for p in model.parameters():
        groups[owner[id(p)]].append(p)
    return groups


def check_optimizers(model: Module, inner: Any, outer: Any) -> None:
    """Two optimizers; the outer one over the model's trainable parameters (and perhaps
    its frozen ones), else a ValueError naming the fix."""
    if inner is outer:
        raise ValueError("the inner and outer optimizers must be two optimizers (the outer "
                         "one runs only at synchronisations)")
    mine = {id(p) for p in model.parameters()}
    trained = {id(p) for p in model.parameters() if p.requires_grad}
    held = [p for group in outer.param_groups for p in group["params"]]
    theirs = {id(p) for p in held}
    if not trained <= theirs <= mine:        # frozen ones it may hold: it never steps them
        extra, missing = len(theirs - mine), len(trained - theirs)
        raise ValueError(f"the outer optimizer must hold exactly the model's parameters "
                         f"({extra} not the model's, {missing} of the model's trainable "
                         "ones missing): build it as OuterOpt(model.parameters(), ...)")
