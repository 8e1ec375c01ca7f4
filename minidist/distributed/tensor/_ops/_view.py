"""reshape / view, transpose, permute: where a cut dim goes when the dims are regrouped.

transpose and permute move dims: Shard(d) becomes Shard(the dim d lands on);
Replicate and Partial stay (a permutation is linear). reshape groups the dims:
walking both shapes, a group is the fewest input dims and output dims with equal
products, e.g. (6, 4, 5) -> (2, 3, 20): [6] -> [2, 3] (a split), [4, 5] -> [20]
(a merge). Per mesh dimension, with n its size and L the cut dim's length as
that mesh dim sees it:

    x's placement           group                    out            (else: Replicate first)
    Shard(d)                [d] -> [e]               Shard(e)
    Shard(d), d first       [d, ..] -> [e, ..]       Shard(e)       if L % n == 0 and
                            (merge, split, both)                    len(e) % n == 0
    Shard(d), d not first   any                      -> Replicate first
    Replicate, Partial      any                      the same

Why the first dim only: rank r's rows r*L/n .. of the group's outermost dim are a
contiguous run of the group's elements, and cut evenly they are exactly the
r-th piece of the output's outermost dim. A cut of an inner dim is strided in
the output (torch calls that _StridedShard), so it is gathered first, as torch
reshape does; ``view`` refuses instead (torch's strict view), naming the dim.
The gradient comes back laid out as the input (its reshape, transpose back).
"""
from __future__ import annotations

from typing import Any

from minidist.distributed.tensor._ops._common import Rule, run_rule
from minidist.distributed.tensor._redistribute import DTensorSpec, normalize_for_grad
from minidist.distributed.tensor.placement_types import Replicate, Shard


def view_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list, list]]:
    """The groups (input dims, output dims) of equal products, in order; a size-1 dim is
    a group of its own; a tensor with no element is one group."""
    if 0 in a or 0 in b:
        return [(list(range(len(a))), list(range(len(b))))]
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(b) and b[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        ins, outs, pi, po = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pi != po:
            if pi < po:
                ins.append(i)
                pi *= a[i]
                i += 1
            else:
                outs.append(j)
                po *= b[j]
                j += 1
        groups.append((ins, outs))
    return groups


def _resolve(shape: tuple, numel: int) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if list(shape).count(-1) > 1:
        raise ValueError(f"reshape: only one dim may be -1, got {shape}")
    known = 1
    for s in shape:
        known *= s if s != -1 else 1
    if -1 in shape:
        if known == 0 or numel % known:
            raise ValueError(f"reshape: cannot infer -1 in {shape} for {numel} elements")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    return tuple(int(s) for s in shape)


def reshape(x: Any, *shape: Any, strict: bool = False) -> Any:
    """x as ``shape`` (module docstring's table); ``strict``: view, which refuses to move."""
    op = "view" if strict else "reshape"
    numel = 1
    for s in x.shape:
        numel *= s
    new = _resolve(shape, numel)
    count = 1
    for s in new:
        count *= s
    if count != numel:
        raise ValueError(f"{op}: shape {new} has {count} elements, the DTensor {x.shape} has "
                         f"{numel}")
    groups = view_groups(tuple(x.shape), new)
    group_of = {d: g for g in groups for d in g[0]}
    seen_in, seen_out = list(x.shape), list(new)         # lengths as each mesh dim sees them
    needed, out = [], []
    for n, p in zip(x.device_mesh.shape, x.placements):
        if not isinstance(p, Shard):
            needed.append(p)
            out.append(p)
            continue
        ins, outs = group_of[p.dim]
        if len(ins) == 1 and len(outs) == 1:
            keep = True
        else:
            keep = bool(outs) and p.dim == ins[0] and seen_in[p.dim] % n == 0 \
                and seen_out[outs[0]] % n == 0
        if not keep:
            if strict:
                raise ValueError(f"view: Shard(dim={p.dim}) of {x.shape} cannot stay cut in "
                                 f"{new} (an inner or uneven dim of a regrouped block): "
                                 "redistribute that dim to Replicate() first, or use reshape")
            needed.append(Replicate())
            out.append(Replicate())
            continue
        seen_in[p.dim] = -(-seen_in[p.dim] // n)
        seen_out[outs[0]] = -(-seen_out[outs[0]] // n)
        needed.append(p)
        out.append(Shard(outs[0]))
    local_shape = DTensorSpec(x.device_mesh, tuple(out), new).local_shape()
    rules = [Rule((a,), normalize_for_grad((a,)), b) for a, b in zip(needed, out)]
    return run_rule(op, lambda t: t.reshape(local_shape), [x], rules, new)


def permute(x: Any, *dims: Any) -> Any:
    """x with its dims reordered: out dim k is x's dim ``dims[k]``; Shard(d) -> Shard(k)."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    if sorted(d % max(x.ndim, 1) for d in dims) != list(range(x.ndim)):
        raise ValueError(f"permute: {dims} is not a permutation of the {x.ndim} dims")
    dims = tuple(d % x.ndim for d in dims)
    where = {d: k for k, d in enumerate(dims)}           # x's dim d lands on dim where[d]
    rules = [Rule((p,), normalize_for_grad((p,)), Shard(where[p.dim]) if isinstance(p, Shard) else p)
             for p in x.placements]
    return run_rule("permute", lambda t: t.permute(*dims), [x], rules,
                    tuple(x.shape[d] for d in dims))


def transpose(x: Any, dim0: int, dim1: int) -> Any:
    """x with ``dim0`` and ``dim1`` swapped (a permute)."""
    dims = list(range(x.ndim))
    dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return permute(x, *dims)
