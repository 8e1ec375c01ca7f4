"""Tensors that are one rank's piece of a larger tensor, and how their reductions combine.

``fully_shard`` and ``parallelize_module`` (minidist.distributed) cut a parameter
over the ranks of a device mesh, expert parallelism spreads a layer's experts over
ranks, the tensor-parallel layers slice their weights: on each rank the Parameter
is a piece of the whole. Two things below the distributed layer must then reduce over the other
pieces too, as torch does for DTensor parameters: the gradient norm of
``clip_grad_norm_`` (optim/clip.py) and the inf / NaN check of ``GradScaler``
(precision/grad_scaler.py). They cannot talk to other ranks (they sit below comm),
so the layer that cuts a parameter registers it here with a *layout*
(distributed/tensor/_piece_norm.py):

    layout.key                         tells kinds of cut apart on this rank
    layout.combine(value, norm_type)   the sum (for norm_type inf: the max) of value
                                       over the ranks that hold the other pieces:
                                       a collective, so every rank must call it
    layout.combine_tensor(value, ...)  the same over the ranks that hold pieces of this
                                       one tensor (a trust ratio's norm, an FP8 amax):
                                       none for an expert, a whole tensor on its rank

``piece_kinds`` groups parameters by kind in the order the list first meets each,
which is the same on every rank (each builds the same model), so the collectives
line up.

A pipeline stage's parameters are whole tensors, but the other stages hold the rest of
the model: ``run_pipeline`` registers them with ``register_stage``, under a layout whose
``combine`` reduces over the pipeline group. ``GradScaler`` max-combines its inf / NaN
flag over it last (each stage's pieces combine first, within the stage), so the stages
skip a step together; ``optim.clip_grad_norm_`` refuses them (a stage's norm is not the
model's, and the tied embedding must count once: ``parallel.clip_grad_norm_``).
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

_pieces: dict[int, tuple[weakref.ref, Any]] = {}   # id(param) -> (the param, its layout)
_stages: dict[int, tuple[weakref.ref, Any]] = {}   # id(param) -> (the param, its pipeline's)


def _register(registry: dict, param: Any, layout: Any) -> None:
    key = id(param)
    registry[key] = (weakref.ref(param, lambda _: registry.pop(key, None)), layout)


def _layout(registry: dict, param: Any) -> Any:
    found = registry.get(id(param))
    return found[1] if found is not None and found[0]() is param else None


def register_piece(param: Any, layout: Any) -> None:
    """``param`` is this rank's piece of a tensor cut over several ranks, laid out as
    ``layout`` (module docstring)."""
    _register(_pieces, param, layout)


def piece_layout(param: Any) -> Any:
    """The layout ``param`` was registered with, or None for a whole tensor."""
    return _layout(_pieces, param)


def register_stage(param: Any, layout: Any) -> None:
    """``param`` belongs to this rank's pipeline stage; ``layout.combine`` reduces over
    the pipeline group (module docstring)."""
    _register(_stages, param, layout)


def stage_layout(param: Any) -> Any:
    """The pipeline layout ``param`` was registered with, or None outside a pipeline."""
    return _layout(_stages, param)


def stage_kinds(params: Iterable[Any]) -> list:
    """The pipeline layouts of ``params``, each once, in first-met order."""
    kinds: dict = {}
    for p in params:
        layout = stage_layout(p)
        if layout is not None:
            kinds.setdefault(layout.key, layout)
    return list(kinds.values())


def piece_kinds(params: Iterable[Any]) -> tuple[list, list[tuple[Any, list]]]:
    """(the whole tensors, [(layout, its pieces), ...] by kind, in first-met order)."""
    whole, kinds = [], {}
    for p in params:
        layout = piece_layout(p)
        if layout is None:
            whole.append(p)
        else:
            kinds.setdefault(layout.key, (layout, []))[1].append(p)
    return whole, list(kinds.values())
