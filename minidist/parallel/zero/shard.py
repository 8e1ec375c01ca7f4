"""Flat, padded shards: how ZeRO cuts a group of parameters between N ranks.

The parameters of a group are laid end to end in one flat vector of P elements,
padded with zeros to a multiple of N, and cut into N equal shards:

    S = ceil(P / N)            shard size, elements
    rank r owns flat[r*S : (r+1)*S]
    padding: N*S - P < N zeros at the end, owned by the last rank(s)

A parameter may straddle two shards: that is fine for elementwise optimizers
(SGD, Adam, AdamW), which update each element from its own gradient and state.
The shards of one group are what reduce_scatter produces from the flat
gradient, and what all_gather reassembles into the flat parameters.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.backend import xp


class FlatLayout:
    """Where each parameter of ``params`` lives in the flat, padded vector."""

    def __init__(self, params: list[Tensor], world_size: int, rank: int):
        if not params:
            raise ValueError("a flat group needs at least one parameter")
        dtypes = {p.data.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"a flat group holds one dtype, got {sorted(map(str, dtypes))}")
        self.params = params
        self.dtype = params[0].data.dtype
        self.shapes = [tuple(p.data.shape) for p in params]
        self.numels = [int(p.data.size) for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)                              # P
        self.world_size, self.rank = world_size, rank
        self.shard_size = -(-self.numel // world_size)             # S = ceil(P / N)
        self.padded = self.shard_size * world_size                 # N * S
        self.lo = rank * self.shard_size                           # my shard: [lo, hi)
        self.hi = self.lo + self.shard_size

    def views(self, flat: Any) -> list[Any]:
        """Arrays shaped like the parameters, viewing ``flat`` (no copy)."""
        return [flat[o:o + n].reshape(s) for o, n, s in zip(self.offsets, self.numels,
                                                              self.shapes)]

    def flatten(self, arrays: list[Any | None]) -> Any:
        """A new padded flat vector (N*S,) of ``arrays``; None and padding are zeros."""
        flat = xp.zeros(self.padded, dtype=self.dtype)
        for a, o, n in zip(arrays, self.offsets, self.numels):
            if a is not None:
                flat[o:o + n] = a.reshape(-1)
        return flat

    def my_shard(self, flat: Any) -> Any:
        """This rank's shard of a padded flat vector (a view)."""
        return flat[self.lo:self.hi]


def reshard(old_shards: list[Any], numel: int, world_size: int, rank: int) -> Any:
    """Rank ``rank``'s shard at ``world_size`` from the shards written at another size.

    The old shards concatenated, with their padding dropped, are the logical flat
    vector of ``numel`` elements; pad it for the new world size and cut.
    """
    full = xp.concatenate([xp.asarray(s).reshape(-1) for s in old_shards])[:numel]
    size = -(-numel // world_size)
    padded = xp.zeros(size * world_size, dtype=full.dtype)
    padded[:numel] = full
    return padded[rank * size:(rank + 1) * size].copy()
