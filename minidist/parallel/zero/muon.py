"""Muon on ZeRO-1/2's flat shards: each shard holds segments of several matrices.

A rank's flat shard (shard.py) is the elements [r S, (r + 1) S) of its group's
parameters laid end to end: a matrix W_i at [o_i, o_i + P_i) has, on rank r, the
piece [max(o_i, r S), min(o_i + P_i, (r + 1) S)) — one block of its flat elements,
empty on the ranks its span misses. Muon's momentum and step run on the whole shard
(elementwise); for the iteration each matrix's pieces are brought together as
distributed/muon.py does for fully_shard's rows, by "gather" (Moonlight trained its
16B MoE so, ZeRO-1 style) or "round_robin". Every parameter must be a matrix: give
the others (biases, norms, embeddings) to a second optimizer outside ZeRO, or keep
them out of the ZeRO module.

    zero = Zero1(model, Muon, lr=0.02, scheme="round_robin")
"""
from __future__ import annotations

from typing import Any

from minidist.distributed.muon import MatrixPieces, ShardedMuon
from minidist.optim.muon import MatrixUpdate, refuse_non_matrix
from minidist.parallel.zero.shard import FlatLayout


def flat_pieces(layout: FlatLayout, group: Any) -> list[MatrixPieces]:
    """How each parameter of ``layout`` is cut over the ranks' flat shards."""
    size = layout.shard_size                                                  # S
    out = []
    for shape, offset, numel in zip(layout.shapes, layout.offsets, layout.numels):
        where = []
        for r in range(layout.world_size):
            lo = max(offset, r * size)
            hi = max(lo, min(offset + numel, (r + 1) * size))
            where.append(slice(lo - offset, hi - offset))      # in the matrix's flat elements
        out.append(MatrixPieces(tuple(shape), group, where))
    return out


class FlatShardMuon(ShardedMuon):
    """ShardedMuon whose parameters are ZeRO's flat shards (module docstring)."""

    def __init__(self, shards: list, layouts: list[FlatLayout], group: Any,
                 scheme: str = "round_robin", **muon_kwargs: Any):
        self.layouts = {id(s): layout for s, layout in zip(shards, layouts)}
        self.flat_pieces = {id(s): flat_pieces(layout, group)
                            for s, layout in zip(shards, layouts)}
        super().__init__(shards, {}, scheme=scheme, **muon_kwargs)

    def check_matrices(self, p: Any) -> None:
        layout = self.layouts[id(p)]
        for shape in layout.shapes:
            refuse_non_matrix(shape, "a parameter that ZeRO shards")

    def matrices(self, p: Any, update: Any) -> list[MatrixUpdate]:
        """Each matrix's segment of my shard: a view of the shard and of its U_t (empty
        where the matrix misses my shard, so that every rank lists every matrix)."""
        layout = self.layouts[id(p)]
        base = layout.rank * layout.shard_size
        items = []
        for pieces, offset in zip(self.flat_pieces[id(p)], layout.offsets):
            mine = pieces.where[layout.rank]
            at = slice(mine.start + offset - base, mine.stop + offset - base)
            items.append(MatrixUpdate(p.data[at], update[at], pieces.shape, pieces))
        return items
