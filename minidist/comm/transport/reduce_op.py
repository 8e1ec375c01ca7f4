"""Reduction operators: ``ReduceOp.SUM``, ``AVG``, ``MAX``, ``MIN``, ``PROD``.

Each op names the elementwise function of the array backend that combines two
arrays in place (``xp.add(a, b, out=a)``). AVG reduces with ``add`` and divides
by the group size once, at the end, on the rank that owns the final value (so
every rank still receives the same bits). For integer dtypes AVG divides with
``floor_divide``, rounding toward minus infinity.
"""
from __future__ import annotations

import enum
from typing import Any

from minidist.backend import xp


class ReduceOp(enum.Enum):
    SUM = "add"
    AVG = "avg"
    PROD = "multiply"
    MAX = "maximum"
    MIN = "minimum"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    # A member is its own only equal (Enum compares by identity), so hashing by
    # identity is as good as Enum's hash of the name, a Python call that a small
    # all-reduce pays for in the key of its kept plan (api.py).
    __hash__ = object.__hash__


def combine_fn(op: ReduceOp):
    """The backend function ``f(a, b, out=a)`` that folds ``b`` into ``a``."""
    name = "add" if op is ReduceOp.AVG else op.value
    return getattr(xp, name)


def finish(op: ReduceOp, acc: Any, group_size: int) -> None:
    """Apply the last step of the op in place: divide by N for AVG, else nothing."""
    if op is not ReduceOp.AVG or acc.size == 0:
        return
    if acc.dtype.kind in "iu":
        xp.floor_divide(acc, group_size, out=acc)
    elif acc.dtype.kind in "fc":
        xp.divide(acc, group_size, out=acc)
    else:
        raise TypeError(f"ReduceOp.AVG is not defined for dtype {acc.dtype}")


def fold_in_order(arrays: list, out: Any, combine, op: ReduceOp) -> None:
    """out = op(arrays[0], arrays[1], ..., arrays[-1]), folded left to right (at
    least two arrays; ``combine`` is ``combine_fn(op)``): the order every rank
    of an all-gather all-reduce folds in, so all get the same bits."""
    combine(arrays[0], arrays[1], out=out)
    for a in arrays[2:]:
        combine(out, a, out=out)
    finish(op, out, len(arrays))


def reduce_reference(arrays: list, op: ReduceOp) -> Any:
    """The single-process oracle: fold ``arrays`` left to right with ``op``."""
    acc = arrays[0].copy()
    fn = combine_fn(op)
    for a in arrays[1:]:
        fn(acc, a, out=acc)
    finish(op, acc, len(arrays))
    return acc
