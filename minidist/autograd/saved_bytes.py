"""Bytes the graph keeps for backward: what ``save_for_backward`` stored, counted once.

Walk every op node (``Context``) reachable from an output and add up the arrays
each saved. Views share memory with the array they view (``q, k, v = split(qkv)``
keeps one (b, s, 3h) buffer, not three), so each array is traced to the buffer
that owns its memory and every buffer is counted once. Parameters are not
activations: arrays whose buffer belongs to a tensor in ``exclude`` are left out.

This is the "activation memory" of Korthikanti et al. 2022, measured:
``minidist.calc.activation_memory_per_layer`` is its closed form, and
demos/14_cost_models_observed.py holds one against the other.
"""
from __future__ import annotations

from typing import Any, Iterable

from minidist.autograd.tensor import Tensor


def _owner(array: Any) -> Any:
    """The array that owns ``array``'s memory (itself unless it is a view)."""
    while getattr(array, "base", None) is not None:
        array = array.base
    return array


def saved_bytes(output: Tensor, exclude: Iterable[Tensor] = ()) -> int:
    """Bytes of the distinct buffers saved for backward in ``output``'s graph.

    ``exclude``: tensors (e.g. ``module.parameters()``) whose memory is not counted.
    """
    skip = {id(_owner(t.data)) for t in exclude}
    seen: set[int] = set()
    total = 0
    nodes = [output._ctx] if output._ctx is not None else []
    visited: set[int] = set()
    while nodes:
        node = nodes.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        for array in getattr(node, "saved", ()):
            if array is None or not hasattr(array, "nbytes"):
                continue
            owner = _owner(array)
            if id(owner) in skip or id(owner) in seen:
                continue
            seen.add(id(owner))
            total += owner.nbytes
        nodes.extend(t._ctx for t in node.inputs if t is not None and t._ctx is not None)
    return total
