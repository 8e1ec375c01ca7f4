"""parallelize_module: apply a plan, a dict from module names to styles, to an unchanged model.

    plan = {"blocks.0.mlp.c_fc": ColwiseParallel(), "blocks.0.mlp.c_proj": RowwiseParallel()}
    parallelize_module(model, mesh["tp"], plan)

Names are ``named_modules`` paths; a ``*`` matches any one part
(``"blocks.*.mlp.c_fc"``), as in torch. A name that matches no module is an
error listing the names that exist nearby, not a plan silently half-applied.
A parameter two modules share (a tied embedding and head) stays one Parameter,
which the plan must cut the same way on both sides. A plan given a module that holds
one side only (``parallelize_module(model.lm_head, mesh, ColwiseParallel())`` on a
tied GPT) is refused: it would cut ``lm_head.weight`` while ``wte.weight`` stayed
whole, two copies trained apart (nn/ties.py); apply the plan at the root.

``async_tp=True`` (torchtitan's ``enable_async_tp``): each column style whose input
arrives cut by position and each row style whose output leaves cut by position fuses
its collective with its matmul as a ring (async_tp.py).
"""
from __future__ import annotations

import copy
import fnmatch
from typing import Any

from minidist.nn.layers import Linear
from minidist.nn.module import Module
from minidist.nn.ties import ties_leaving
from minidist.distributed.tensor.parallel.style import (ColwiseParallel, ParallelStyle,
                                                        RowwiseParallel)
from minidist.distributed.tensor.placement_types import Shard


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p)
                                            for p, n in zip(parts, names))


def parallelize_module(module: Module, device_mesh: Any = None,
                       parallelize_plan: ParallelStyle | dict | None = None, *,
                       async_tp: bool = False) -> Module:
    """Shard ``module`` over the 1-D ``device_mesh`` as ``parallelize_plan`` says (a style
    for the module itself, or a dict of names to styles); returns the module.
    ``async_tp``: fuse the sequence-parallel gathers and reduce-scatters with their
    matmuls (module docstring)."""
    if device_mesh is None:
        raise ValueError("parallelize_module needs device_mesh (a 1-D mesh, e.g. mesh['tp'])")
    if device_mesh.ndim != 1:
        raise ValueError(f"parallelize_module takes a 1-D mesh, got {device_mesh.ndim} "
                         f"dimensions {device_mesh.mesh_dim_names}: pass mesh['tp']")
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        style = _fused(parallelize_plan, module, async_tp)
        _something_to_fuse([style], async_tp)
        _refuse_ties_leaving(module, [module])
        return style._apply(module, device_mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError("parallelize_plan must be a ParallelStyle or a dict of module names "
                        f"to styles, got {type(parallelize_plan).__name__}")
    targets = _targets(module, parallelize_plan, async_tp)
    _something_to_fuse([style for _, style in targets], async_tp)
    _refuse_ties_leaving(module, [target for target, _ in targets])
    modules = dict(module.named_modules())
    tied = _tied_parameters(modules)
    for target, style in targets:
        style._apply(target, device_mesh)
    _tie_again(modules, tied)
    return module


def _something_to_fuse(styles: list, async_tp: bool) -> None:
    """Refuse async_tp where no style has a collective to fuse, as the layers refuse it
    without sequence parallelism."""
    if async_tp and not any(getattr(style, "async_tp", False) for style in styles):
        raise ValueError("parallelize_module(async_tp=True): no column style takes its input "
                         "cut by position and no row style leaves its output so, so there is "
                         "no gather or reduce-scatter to fuse; async TP needs sequence "
                         "parallelism (e.g. gpt_tp_plan(..., sequence_parallel=True))")


def _refuse_ties_leaving(module: Module, targets: list[Module]) -> None:
    """Raise if a style would replace a parameter that a module outside ``module``
    holds too (a tied embedding and head, the plan given one of them)."""
    for target in targets:
        for t in ties_leaving(target):
            if t in ties_leaving(module):
                raise ValueError(
                    f"parallelize_module: {t.name} is {t.other_name} (tied weights), and "
                    f"{t.other_name.rpartition('.')[0] or 'the root'} lies outside the "
                    f"{type(module).__name__} given; the plan would cut {t.name} alone and "
                    f"leave {t.other_name} whole, two copies trained apart. Apply the plan "
                    f"at the root, parallelize_module(model, mesh, {{...}}), naming both "
                    f"modules: it cuts them the same way and ties them again")


def _targets(module: Module, plan: dict, async_tp: bool) -> list[tuple[Module, ParallelStyle]]:
    """(module, style) for every name the plan matches, or a clear error."""
    modules = dict(module.named_modules())
    targets = []
    for pattern, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"plan entry {pattern!r}: {style!r} is not a ParallelStyle")
        found = [name for name in modules if name and _matches(pattern, name)]
        if not found:
            head = pattern.rsplit(".", 1)[0] if "." in pattern else ""
            near = sorted(n for n in modules if n and n.startswith(head))[:8]
            raise ValueError(f"plan names {pattern!r}, but {type(module).__name__} has no such "
                             f"module; modules there: {near}")
        targets += [(modules[name], _fused(style, modules[name], async_tp)) for name in found]
    return targets


def _fused(style: ParallelStyle, target: Module, async_tp: bool) -> ParallelStyle:
    """``style``, or under ``async_tp`` a copy with async TP on where it has a collective
    to fuse: a column style's Shard input, a row style's Shard output, on a Linear."""
    if not async_tp or not isinstance(target, Linear):
        return style
    if isinstance(style, ColwiseParallel):
        layout = style.input_layout
    elif isinstance(style, RowwiseParallel):
        layout = style.output_layout
    else:
        return style
    if not isinstance(layout, Shard):
        return style
    fused = copy.copy(style)
    fused.async_tp = True
    return fused


def _tied_parameters(modules: dict) -> list[list[tuple[str, str, Any]]]:
    """Parameters that several modules share (GPT's lm_head.weight is wte.weight):
    lists of (module name, attribute, parameter) naming one object."""
    by_id: dict[int, list] = {}
    for owner, m in modules.items():
        for attr, p in m._parameters.items():
            if p is not None:
                by_id.setdefault(id(p), []).append((owner, attr, p))
    return [users for users in by_id.values() if len(users) > 1]


def _tie_again(modules: dict, tied: list) -> None:
    """Each style cut its module's copy of a tied parameter; make them one Parameter
    again, which needs the same cut on every side (wte RowwiseParallel and lm_head
    ColwiseParallel both cut the vocabulary: Shard(0))."""
    for users in tied:
        owners = [modules[o] for o, _, _ in users]
        now = [m._parameters[a] for m, (_, a, _) in zip(owners, users)]
        layouts = [m.__dict__.get("_dtensor_placements", {}).get(a)
                   for m, (_, a, _) in zip(owners, users)]
        if all(p is now[0] for p in now):
            continue
        cuts = [None if lay is None else (lay[1], lay[2]) for lay in layouts]
        if any(c != cuts[0] for c in cuts):
            names = [f"{o}.{a}" for o, a, _ in users]
            raise ValueError(f"{names} are one tied parameter, but the plan cuts them "
                             f"differently ({cuts}): give every module that shares it a style "
                             f"with the same cut (e.g. wte RowwiseParallel with lm_head "
                             f"ColwiseParallel: both Shard(0), by vocabulary)")
        for m, (_, attr, _) in zip(owners[1:], users[1:]):
            setattr(m, attr, now[0])
