"""embedding: rows of a (V, D) table picked by integer ids, per mesh dimension.

    table         ids          out          dtable arrives as
    Replicate     Replicate    Replicate    Replicate
    Shard(1)      Replicate    Shard(-1)    Shard(1)    each rank has D/t columns of every row
    Shard(0)      Replicate    Partial      Shard(0)    torch's MaskPartial (below)
    Replicate     Shard(i)     Shard(i)     Partial     each rank looks up its ids only

A vocab-cut table (Shard(0)) holds rows [lo, hi) on each rank: the lookup takes
the rows of the ids in that range and zeros for the others (a mask), so the
ranks' outputs sum to the table's rows: out = sum_r mask_r * table_r[ids - lo_r],
Partial. Its backward scatters dout into the rank's own rows only (the mask is 0
elsewhere): Megatron's VocabParallelEmbedding, as a placement. Other pairs fall
back to Replicate with a warning. ids may be a DTensor or a plain integer array
(then Replicate).
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.backend import to_host, xp
from minidist.distributed.tensor._ops._common import P, R, Rule, check_dtensors, run_rule
from minidist.distributed.tensor._redistribute import DTensorSpec
from minidist.distributed.tensor.placement_types import Placement, Shard
from minidist.nn import functional as F


def _masked_lookup(ids: Any, table: Tensor, lo: int) -> Tensor:
    """table[ids - lo] where lo <= ids < lo + rows, else 0: (*ids.shape, D)."""
    rows = table.shape[0]
    mine = (ids >= lo) & (ids < lo + rows)                     # (*ids.shape,)
    if rows == 0:       # an empty piece holds no row: zeros, still on the autograd graph
        zeros = Tensor(xp.zeros(tuple(ids.shape) + (table.shape[1],), dtype=table.dtype))
        return zeros + table.sum(axis=0)                       # a sum over 0 rows: 0
    picked = F.embedding(xp.where(mine, ids - lo, 0), table)   # (*ids.shape, D)
    return picked * mine[..., None].astype(table.dtype)


def embedding(ids: Any, weight: Any) -> Any:
    """out[...] = weight[ids[...]] (module docstring's table)."""
    from minidist.distributed.tensor._api import DTensor
    check_dtensors("embedding", weight)
    mesh = weight.device_mesh
    if not isinstance(ids, DTensor):
        ids = DTensor.from_local(ids.data if isinstance(ids, Tensor) else ids, mesh,
                                 [R] * mesh.ndim)
    if weight.ndim != 2:
        raise ValueError(f"embedding: the table must be (V, D), got shape {weight.shape}")
    raw = ids.to_local()
    raw = raw.data if isinstance(raw, Tensor) else raw
    if raw.size and (int(to_host(raw.min())) < 0 or int(to_host(raw.max())) >= weight.shape[0]):
        raise IndexError(f"embedding: an id is out of range for a table of {weight.shape[0]} "
                         "rows")
    last = ids.ndim                                            # out: (*ids.shape, D)

    def rule(pw: Placement, pi: Placement):
        if pw.is_replicate() and pi.is_replicate():
            return Rule((R, R), (R, R), R)
        if pw == Shard(1) and pi.is_replicate():
            return Rule((pw, R), (pw, R), Shard(last))
        if pw == Shard(0) and pi.is_replicate():
            return Rule((pw, R), (pw, R), P)
        if pw.is_replicate() and isinstance(pi, Shard):
            return Rule((R, pi), (P, pi), pi)
        return None
    rules = [rule(pw, pi) for pw, pi in zip(weight.placements, ids.placements)]
    table_placements = tuple(r.inputs[0] for r in rules) \
        if all(rules) else (R,) * mesh.ndim
    lo = DTensorSpec(mesh, table_placements, weight.shape).local_offset()[0]
    vocab_cut = any(p == Shard(0) for p in table_placements)

    def fn(w: Tensor, i: Any) -> Tensor:
        i = i.data if isinstance(i, Tensor) else i
        return _masked_lookup(i, w, lo) if vocab_cut else F.embedding(i, w)
    return run_rule("embedding", fn, [weight, ids], rules, tuple(ids.shape) + (weight.shape[1],))
