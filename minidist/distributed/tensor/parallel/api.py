"""parallelize_module: apply a plan, a dict from module names to styles, to an unchanged model.

    plan = {"blocks.0.mlp.c_fc": ColwiseParallel(), "blocks.0.mlp.c_proj": RowwiseParallel()}
    parallelize_module(model, mesh["tp"], plan)

Names are ``named_modules`` paths; a ``*`` matches any one part
(``"blocks.*.mlp.c_fc"``), as in torch. A name that matches no module is an
error listing the names that exist nearby, not a plan silently half-applied.
"""
from __future__ import annotations

import fnmatch
from typing import Any

from minidist.nn.module import Module
from minidist.distributed.tensor.parallel.style import ParallelStyle


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p)
                                            for p, n in zip(parts, names))


def parallelize_module(module: Module, device_mesh: Any = None,
                       parallelize_plan: ParallelStyle | dict | None = None) -> Module:
    """Shard ``module`` over the 1-D ``device_mesh`` as ``parallelize_plan`` says (a style
    for the module itself, or a dict of names to styles); returns the module."""
    if device_mesh is None:
        raise ValueError("parallelize_module needs device_mesh (a 1-D mesh, e.g. mesh['tp'])")
    if device_mesh.ndim != 1:
        raise ValueError(f"parallelize_module takes a 1-D mesh, got {device_mesh.ndim} "
                         f"dimensions {device_mesh.mesh_dim_names}: pass mesh['tp']")
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan._apply(module, device_mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError("parallelize_plan must be a ParallelStyle or a dict of module names "
                        f"to styles, got {type(parallelize_plan).__name__}")
    modules = dict(module.named_modules())
    for pattern, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"plan entry {pattern!r}: {style!r} is not a ParallelStyle")
        found = [name for name in modules if name and _matches(pattern, name)]
        if not found:
            head = pattern.rsplit(".", 1)[0] if "." in pattern else ""
            near = sorted(n for n in modules if n and n.startswith(head))[:8]
            raise ValueError(f"plan names {pattern!r}, but {type(module).__name__} has no such "
                             f"module; modules there: {near}")
        for name in found:
            style._apply(modules[name], device_mesh)
    return module
