"""The outer gradient cut into slices over the ranks of a replica that hold the same theta.

A DiLoCo replica that is data-parallel inside (DDP over its L ranks) holds the same
parameters on every one of them (DDP keeps them equal), so each of the L ranks has the
same outer gradient Delta (n values, the fragment's tensors laid end to end). All-reducing
the whole of it from every rank puts L copies of the same bytes on the slow link. With
``shard_group`` (the L ranks of this rank's replica, the fast link), rank j of the
replica reduces only its slice across the replicas, and the replica then all-gathers the
averaged slices:

    c = ceil(n / L)                                        the slice length
    Delta_j = (1/N) sum_i Delta_i[j c : (j + 1) c]          all-reduce over ``group``
    Delta = [Delta_0 | Delta_1 | ... | Delta_{L-1}][:n]     all-gather over ``shard_group``

(Delta padded with zeros to L c values.) Each slice is averaged once and copied, so every
rank of every replica ends with the same bits, as without slices. Per
rank and sync, the slow link carries 2(N-1)/N * n/L values instead of 2(N-1)/N * n: a
factor L fewer; the fast link carries (L-1)/L * n more. With ``outer_grad_format`` rank j
sends the codes of its slice (each tensor's scale still from the whole tensor,
outer_grad.py). It is HSDP's trick (replicate across, shard inside) for DiLoCo, as torch's
FSDP HYBRID_SHARD names the group inside a node its shard group.

Invariant: the ranks of ``shard_group`` are this rank's replica's (no other rank of
``group``) and hold the same parameters (not pieces of them: a fully_shard or
tensor-parallel replica already sends only its pieces).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp
from minidist.distributed.tensor._piece_norm import refuse_pieces_as_replicas


@dataclass
class ReplicaSlices:
    """This rank's slice of each outer gradient: slice ``index`` of ``size``."""
    group: Any                       # the replica's ranks that hold the same theta
    index: int                       # j: this rank's place in it
    size: int                        # L

    def chunk(self, n: int) -> int:
        """c = ceil(n / L), the length of every slice."""
        return -(-n // self.size)

    def bounds(self, n: int) -> tuple[int, int]:
        """[lo, hi) of this rank's slice among the n values (the last may be shorter)."""
        c = self.chunk(n)
        return min(self.index * c, n), min((self.index + 1) * c, n)

    def take(self, flat: Any) -> Any:
        """This rank's slice of ``flat`` ((n,)), padded with zeros to (c,): a new array."""
        lo, hi = self.bounds(flat.size)
        part = xp.zeros(self.chunk(flat.size), dtype=flat.dtype)           # (c,)
        part[:hi - lo] = flat[lo:hi]
        return part

    def gather(self, part: Any, n: int) -> Any:
        """Every rank's averaged slice laid end to end: (n,) from this rank's ``part``
        ((hi - lo,) or (c,)), an all-gather over the replica."""
        c = self.chunk(n)
        padded = xp.zeros(c, dtype=part.dtype)                             # (c,)
        padded[:part.size] = part[:c]
        whole = xp.empty(self.size * c, dtype=part.dtype)                   # (L c,)
        dist.all_gather_into_tensor(whole, padded, group=self.group)
        return whole[:n]


def replica_slices(shard_group: Any, group: Any, named_params: list) -> ReplicaSlices | None:
    """The slices of ``shard_group`` (None: no slicing), or a ValueError naming the fix
    when its ranks are not one replica's, or when they hold pieces of the parameters.
    One small all-gather over ``group`` checks every replica slices alike."""
    if shard_group is None:
        return None
    refuse_pieces_as_replicas(named_params, shard_group, "DiLoCo's shard_group")
    mine = set(_ranks(shard_group))
    others = sorted((mine & set(_ranks(group))) - {dist.get_rank()})
    index, size = dist.get_rank(shard_group), dist.get_world_size(shard_group)
    seen = xp.empty((dist.get_world_size(group), 3), dtype=xp.int64)       # (N, 3)
    dist.all_gather_into_tensor(seen, xp.asarray([index, size, len(others)], dtype=xp.int64),
                                group=group)
    seen = [tuple(int(v) for v in row) for row in backend.to_host(seen).tolist()]
    if any(row[2] for row in seen):
        raise ValueError(f"shard_group {sorted(mine)} holds ranks of other replicas (ranks "
                         f"{others or 'of a replica beside this one'} are in DiLoCo's group "
                         "too): it must be the ranks of this rank's own replica, e.g. "
                         "shard_group=mesh['dp'] beside group=mesh['replica']")
    if len({row[:2] for row in seen}) > 1:
        raise ValueError(f"the replicas' ranks sit at different places of their shard_groups "
                         f"((place, size) per replica: {[row[:2] for row in seen]}): give every "
                         "replica a shard_group of the same size, its ranks in the same order "
                         "(one dimension of one mesh)")
    return ReplicaSlices(shard_group, index, size)


def _ranks(group: Any) -> list[int]:
    """The global ranks of ``group`` (None: the world)."""
    return list(range(dist.get_world_size())) if group is None else list(group.ranks)
