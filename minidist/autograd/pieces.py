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
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

_pieces: dict[int, tuple[weakref.ref, Any]] = {}   # id(param) -> (the param, its layout)


def register_piece(param: Any, layout: Any) -> None:
    """``param`` is this rank's piece of a tensor cut over several ranks, laid out as
    ``layout`` (module docstring)."""
    key = id(param)
    _pieces[key] = (weakref.ref(param, lambda _: _pieces.pop(key, None)), layout)


def piece_layout(param: Any) -> Any:
    """The layout ``param`` was registered with, or None for a whole tensor."""
    found = _pieces.get(id(param))
    return found[1] if found is not None and found[0]() is param else None


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
