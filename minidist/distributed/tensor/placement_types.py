"""Placements: how one mesh dimension holds a tensor (torch.distributed.tensor's names).

A DTensor has one placement per mesh dimension:

    Shard(dim)        the tensor is cut along ``dim`` into n pieces, piece r on coordinate r
    Replicate()       every coordinate holds the whole tensor
    Partial("sum")    every coordinate holds a summand; the tensor is their sum
                      (or their "avg", "max", "min")

Uneven pieces are cut as ``torch.chunk`` cuts them: every piece has
``ceil(L / n)`` rows except the last ones, which hold what is left, possibly
nothing. For L = 5 rows over n = 4 ranks the pieces hold 2, 2, 1, 0 rows:

    size(r) = max(0, min(L, (r + 1) * c) - r * c),   offset(r) = min(L, r * c),   c = ceil(L / n)

With several mesh dimensions sharding the same tensor dimension, they cut it
in mesh order: mesh dimension 0 cuts the tensor, dimension 1 cuts dimension
0's piece, and so on (torch's default, left to right).
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp


class Placement:
    """Base of Shard, Replicate and Partial."""

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


class Shard(Placement):
    """Cut along tensor dimension ``dim`` (torch.chunk's pieces, module docstring)."""

    def __init__(self, dim: int):
        if not isinstance(dim, int):
            raise TypeError(f"Shard(dim) takes an int, got {dim!r}")
        self.dim = dim

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self) -> int:
        return hash(("Shard", self.dim))

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """Every coordinate of the mesh dimension holds the whole tensor."""

    def is_replicate(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Replicate)

    def __hash__(self) -> int:
        return hash("Replicate")

    def __repr__(self) -> str:
        return "Replicate()"


REDUCE_OPS = ("sum", "avg", "max", "min")


class Partial(Placement):
    """Every coordinate holds a summand (``reduce_op``: sum, avg, max or min)."""

    def __init__(self, reduce_op: str = "sum"):
        if reduce_op not in REDUCE_OPS:
            raise ValueError(f"Partial({reduce_op!r}): reduce_op must be one of {REDUCE_OPS}")
        self.reduce_op = reduce_op

    def is_partial(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self) -> int:
        return hash(("Partial", self.reduce_op))

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"


# -- the pieces of a dimension ---------------------------------------------------

def local_shard_size_and_offset(length: int, num_chunks: int, rank: int) -> tuple[int, int]:
    """Rows of piece ``rank`` of ``length`` rows cut into ``num_chunks``, and where it starts."""
    chunk = -(-length // num_chunks)                      # ceil(L / n)
    start = min(length, rank * chunk)
    end = min(length, (rank + 1) * chunk)
    return max(0, end - start), start


def chunk_sizes(length: int, num_chunks: int) -> list[int]:
    """The sizes of every piece, in rank order (they sum to ``length``)."""
    return [local_shard_size_and_offset(length, num_chunks, r)[0] for r in range(num_chunks)]


def shard_slice(arr: Any, dim: int, num_chunks: int, rank: int) -> Any:
    """Piece ``rank`` of ``arr`` along ``dim`` (a view)."""
    size, start = local_shard_size_and_offset(arr.shape[dim], num_chunks, rank)
    index = [slice(None)] * arr.ndim
    index[dim] = slice(start, start + size)
    return arr[tuple(index)]


def pad_to(arr: Any, dim: int, length: int) -> Any:
    """``arr`` with zeros appended along ``dim`` up to ``length`` rows (the same array if
    it has them already): collectives move pieces of one size."""
    missing = length - arr.shape[dim]
    if missing == 0:
        return arr
    shape = list(arr.shape)
    shape[dim] = missing
    return xp.concatenate([arr, xp.zeros(tuple(shape), dtype=arr.dtype)], axis=dim)


def normalize_dim(dim: int, ndim: int, what: str) -> int:
    """``dim`` in range(ndim) (negative counts from the end), or a clear error."""
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}: Shard(dim={dim}) is out of range for a tensor of {ndim} "
                         f"dimensions (use a dim in [{-ndim}, {ndim - 1}])")
    return dim % ndim


def local_shape_and_offset(shape: tuple[int, ...], mesh_shape: tuple[int, ...],
                           placements: tuple[Placement, ...],
                           coord: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape of this coordinate's local tensor and where it starts in the global one,
    applying the mesh dimensions' cuts in order (module docstring)."""
    size, offset = list(shape), [0] * len(shape)
    for n, p, c in zip(mesh_shape, placements, coord):
        if isinstance(p, Shard):
            piece, start = local_shard_size_and_offset(size[p.dim], n, c)
            size[p.dim] = piece
            offset[p.dim] += start
    return tuple(size), tuple(offset)
