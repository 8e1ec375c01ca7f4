"""Indexing: slicing, integer-array gather, and the embedding lookup.

Forward picks elements out; backward puts each picked element's gradient back
where it came from. With integer arrays the same element can be picked twice
(``x[[0, 0]]``), so those gradients must be *added* (``scatter_add``); plain
slices never repeat, so assignment is enough and faster.
"""
from __future__ import annotations

from minidist import backend
from minidist.autograd.function import Function
from minidist.backend import xp


def _is_basic(key) -> bool:
    """True if the index uses only ints, slices, None and Ellipsis (no repeats)."""
    keys = key if isinstance(key, tuple) else (key,)
    return all(k is None or k is Ellipsis or isinstance(k, (int, slice)) for k in keys)


class GetItem(Function):
    @staticmethod
    def forward(ctx, a, key):
        ctx.key, ctx.shape, ctx.dtype = key, a.shape, a.dtype
        return a[key]

    @staticmethod
    def backward(ctx, grad):
        full = xp.zeros(ctx.shape, ctx.dtype)
        if _is_basic(ctx.key):
            full[ctx.key] = grad
        else:
            backend.scatter_add(full, ctx.key, grad)
        return full


class Embedding(Function):
    """out[...] = weight[ids[...]]; dL/dweight[v] = sum of dL/dout where ids == v."""

    splits_weight_grad = True     # B/W split: see Function

    @staticmethod
    def forward(ctx, ids, weight):
        # a negative id would silently wrap to a row from the end; refuse it,
        # as torch does (one device sync per call)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0]):
            raise IndexError(f"an id is out of range for an embedding of "
                             f"{weight.shape[0]} rows")
        ctx.save_for_backward(ids)
        ctx.shape, ctx.dtype = weight.shape, weight.dtype
        return weight[ids]                           # (*ids.shape, C)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved
        gw = xp.zeros(ctx.shape, ctx.dtype)
        backend.scatter_add(gw, ids.reshape(-1), grad.reshape(ids.size, ctx.shape[1]))
        return None, gw
