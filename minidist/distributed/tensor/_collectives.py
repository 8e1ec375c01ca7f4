"""One change of placement on one mesh dimension, as one of minidist's collectives.

Each function takes the local array and the mesh dimension's process group
(n ranks, this one is r) and returns the new local array. ``L`` is the length
of the tensor dimension being cut, as this mesh dimension sees it (the piece
that the mesh dimensions before it left); pieces are torch.chunk's
(placement_types.py), so they may differ in size: the collectives move
pieces padded to ``c = ceil(L / n)`` rows and the padding is cut off again,
as torch does.

    change                  collective        bytes sent per rank (M = the whole tensor's
                                              bytes on this mesh dim, c = ceil(L / n))
    Shard(d) -> Replicate   all_gather        (n - 1) * M_c          (M_c = c rows' bytes)
    Partial  -> Replicate   all_reduce        2 (n - 1) / n * M      (ring)
    Partial  -> Shard(d)    reduce_scatter    (n - 1) * M_c
    Shard(d) -> Shard(e)    all_to_all        (n - 1) / n * M / n    (even pieces)
    Replicate -> Shard(d)   none (keep my piece)
    Replicate -> Partial    none (sum: x / n on every rank, torch's choice; avg/max/min: x)
"""
from __future__ import annotations

from typing import Any, Callable

from minidist.backend import xp
from minidist.comm.collectives.api import (all_gather_into_tensor, all_reduce, all_to_all,
                                           reduce_scatter_tensor)
from minidist.comm.group import ProcessGroup
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.distributed.tensor.placement_types import (chunk_sizes, pad_to,
                                                          shard_slice)

REDUCE_OP = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "max": ReduceOp.MAX, "min": ReduceOp.MIN}

class CommObservers:
    """CommDebugMode's extension point (debug/comm_mode.py): who counts the collectives
    of a change of placement, and for which pass they run."""

    def __init__(self) -> None:
        self.modes: list = []        # the modes now counting: mode.record(name, phase, n, bytes)
        self.phase = "forward"       # "backward" inside backward_phase() (the backward ops')

    def note(self, name: str, group: ProcessGroup, nbytes: int) -> None:
        for mode in self.modes:
            mode.record(name, self.phase, group.size, nbytes)


OBSERVED = CommObservers()


def _note(name: str, group: ProcessGroup, nbytes: int) -> None:
    OBSERVED.note(name, group, nbytes)


class backward_phase:
    """``with backward_phase():`` collectives inside count as the backward's."""

    def __enter__(self) -> None:
        self.before = OBSERVED.phase
        OBSERVED.phase = "backward"

    def __exit__(self, *exc: object) -> None:
        OBSERVED.phase = self.before


def all_gather_shard(local: Any, dim: int, length: int, group: ProcessGroup) -> Any:
    """Shard(dim) -> Replicate: every rank's piece, side by side along ``dim``."""
    n = group.size
    sizes = chunk_sizes(length, n)
    c = sizes[0]
    padded = xp.ascontiguousarray(pad_to(local, dim, c))              # (.., c, ..)
    if padded.size == 0:                                              # nothing to move
        shape = list(local.shape)
        shape[dim] = length
        return xp.zeros(tuple(shape), dtype=local.dtype)
    out = xp.empty((n,) + tuple(padded.shape), dtype=local.dtype)     # (n, .., c, ..)
    _note("all_gather_into_tensor", group, padded.nbytes)
    all_gather_into_tensor(out, padded, group=group)
    pieces = []
    for r in range(n):
        index = [slice(None)] * local.ndim
        index[dim] = slice(0, sizes[r])
        pieces.append(out[r][tuple(index)])
    return xp.concatenate(pieces, axis=dim)                           # (.., L, ..)


def all_reduce_partial(local: Any, reduce_op: str, group: ProcessGroup) -> Any:
    """Partial -> Replicate: the reduction of every rank's summand (a new array)."""
    # an array (a 0-d one's arithmetic may have left a NumPy scalar, which no
    # collective can write into), C order; 0-d stays 0-d
    out = xp.array(local, order="C")
    if out.size:
        _note("all_reduce", group, out.nbytes)
        all_reduce(out, op=REDUCE_OP[reduce_op], group=group)
    return out


def reduce_scatter_partial(local: Any, reduce_op: str, dim: int,
                           group: ProcessGroup) -> Any:
    """Partial -> Shard(dim): reduce the summands, keep my piece along ``dim``."""
    n, r = group.size, group.rank
    length = local.shape[dim]
    sizes = chunk_sizes(length, n)
    c = sizes[0]
    padded = pad_to(local, dim, n * c)                                # (.., n*c, ..)
    shape = list(local.shape)
    shape[dim] = c
    if padded.size == 0:
        shape[dim] = sizes[r]
        return xp.zeros(tuple(shape), dtype=local.dtype)
    stacked = xp.stack([xp.ascontiguousarray(shard_slice(padded, dim, n, i))
                        for i in range(n)])                           # (n, .., c, ..)
    out = xp.empty(tuple(shape), dtype=local.dtype)
    _note("reduce_scatter_tensor", group, stacked.nbytes)
    reduce_scatter_tensor(out, stacked, op=REDUCE_OP[reduce_op], group=group)
    index = [slice(None)] * local.ndim
    index[dim] = slice(0, sizes[r])
    return xp.ascontiguousarray(out[tuple(index)])                    # (.., size(r), ..)


def all_to_all_shard(local: Any, src_dim: int, dst_dim: int, src_length: int,
                     group: ProcessGroup) -> Any:
    """Shard(src_dim) -> Shard(dst_dim): cut my piece along ``dst_dim`` into n parts, send
    part j to rank j, and join what arrives along ``src_dim`` in rank order."""
    n, r = group.size, group.rank
    dst_sizes = chunk_sizes(local.shape[dst_dim], n)
    src_sizes = chunk_sizes(src_length, n)
    inputs = [xp.ascontiguousarray(shard_slice(local, dst_dim, n, j)) for j in range(n)]
    outputs = []
    for s in range(n):                       # from rank s: its src piece x my dst piece
        shape = list(local.shape)
        shape[src_dim] = src_sizes[s]
        shape[dst_dim] = dst_sizes[r]
        outputs.append(xp.empty(tuple(shape), dtype=local.dtype))
    rest = 1
    for d, size in enumerate(local.shape):
        if d not in (src_dim, dst_dim):
            rest *= size
    if src_length * local.shape[dst_dim] * rest:       # the same answer on every rank
        _note("all_to_all", group, sum(a.nbytes for a in inputs))
        all_to_all(outputs, inputs, group=group)
    return xp.concatenate(outputs, axis=src_dim)


def partition_replicate(local: Any, reduce_op: str, n: int) -> Any:
    """Replicate -> Partial: summands whose reduction is the tensor again (torch's
    choice for sum: x / n on every rank; for avg, max, min: x itself)."""
    if reduce_op == "sum":
        return local / n
    return local.copy()


# -- many Shard(0) tensors in one collective (FSDP2's copy-in / copy-out) --------------

class GatheredDim0:
    """An all-gather of Shard(0) pieces (all_gather_dim0): ``wait()`` gives the whole
    tensors. With ``async_op=True`` the collective runs on the communication thread
    (comm/collectives/work.py) until ``wait()``; FSDP prefetches the next unit this way.
    ``buffer()`` gives the gathered (n, W) buffer itself (row r: rank r's pieces side by
    side), ``cut_apart`` the whole tensors of a buffer laid out as it is (FSDP decodes a
    low-precision gather's buffer in one pass, then cuts it apart)."""

    def __init__(self, work: Any, out: Any, cut: list[tuple[int, int, tuple]]):
        self.work, self.out, self.cut = work, out, cut

    def buffer(self) -> Any:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.out                                               # (n, W)

    def cut_apart(self, buf: Any) -> list:
        fulls, start = [], 0
        n = buf.shape[0]
        for length, width, shape in self.cut:
            block = buf[:, start:start + width].reshape((n * shape[0],) + shape[1:])
            fulls.append(block[:length])                              # (L_i, ...)
            start += width
        return fulls

    def wait(self) -> list:
        return self.cut_apart(self.buffer())


def all_gather_dim0(locals_: list, lengths: list[int], group: ProcessGroup,
                    async_op: bool = False) -> Any:
    """Shard(0) -> Replicate for several tensors by one all-gather: each piece padded to
    its c_i = ceil(L_i / n) rows, all flattened side by side, gathered, and cut apart.
    Returns the whole tensors, or (``async_op=True``) a GatheredDim0 to ``wait()`` on."""
    gathered = start_all_gather_dim0(locals_, lengths, group, async_op)
    return gathered if async_op else gathered.wait()


def start_all_gather_dim0(locals_: list, lengths: list[int], group: ProcessGroup,
                          async_op: bool) -> GatheredDim0:
    """``all_gather_dim0``'s GatheredDim0, the collective done (``async_op=False``, on
    this thread) or under way."""
    n = group.size
    cut, flats = [], []
    for local, length in zip(locals_, lengths):
        c = chunk_sizes(length, n)[0]
        padded = pad_to(local, 0, c)                                  # (c_i, ...)
        cut.append((length, padded.size, (c,) + tuple(local.shape[1:])))
        flats.append(xp.ascontiguousarray(padded).reshape(-1))
    mine = xp.concatenate(flats) if flats else xp.empty(0)           # (sum c_i * row_i,)
    out = xp.empty((n, mine.size), dtype=mine.dtype)                  # (n, sum ...)
    work = None
    if n == 1:
        out[0] = mine
    elif mine.size:
        _note("all_gather_into_tensor", group, mine.nbytes)
        work = all_gather_into_tensor(out, mine, group=group, async_op=async_op)
    return GatheredDim0(work, out, cut)


def stack_dim0(fulls: list, n: int) -> tuple[Any, list]:
    """The (n, W) buffer whose row j holds piece j of every tensor (each padded to
    n * c_i rows, cut in n, flattened side by side), and what ``unstack_dim0`` needs."""
    parts, shapes = [], []
    for full in fulls:
        sizes = chunk_sizes(full.shape[0], n)
        padded = pad_to(full, 0, n * sizes[0])                        # (n * c_i, ...)
        parts.append(xp.ascontiguousarray(padded).reshape(n, -1))     # (n, c_i * row_i)
        shapes.append((sizes, tuple(full.shape[1:]), parts[-1].shape[1]))
    return xp.concatenate(parts, axis=1), shapes                      # (n, sum ...)


def unstack_dim0(mine: Any, shapes: list, r: int) -> list:
    """Rank r's pieces from its row of ``stack_dim0``'s buffer, padding cut off."""
    pieces, start = [], 0
    for sizes, rest, width in shapes:
        block = mine[start:start + width].reshape((sizes[0],) + rest)
        pieces.append(block[:sizes[r]].copy())                        # (size(r), ...)
        start += width
    return pieces


class ScatteredDim0:
    """A reduce-scatter of several tensors (reduce_scatter_dim0): ``wait()`` gives this
    rank's pieces of each (``pieces()`` of what was received), the padding cut off. With
    ``async_op=True`` the collective runs on the communication thread until ``wait()``;
    fully_shard leaves a unit's gradients so while the units before it compute their
    backward. ``piece_shapes()`` and ``dtype``: what the pieces will be, known at the issue."""

    def __init__(self, work: Any, pieces: Callable[[], list], shapes: list, r: int,
                 dtype: Any):
        self.work, self.pieces, self.shapes, self.r = work, pieces, shapes, r
        self.dtype = dtype

    def piece_shapes(self) -> list[tuple[int, ...]]:
        return [(sizes[self.r],) + rest for sizes, rest, _ in self.shapes]

    def wait(self) -> list:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.pieces()


def reduce_scatter_dim0(fulls: list, reduce_op: str, group: ProcessGroup) -> list:
    """Partial -> Shard(0) for several tensors by one reduce-scatter (rank r keeps rows
    of piece r of each)."""
    return start_reduce_scatter_dim0(fulls, reduce_op, group, async_op=False).wait()


def start_reduce_scatter_dim0(fulls: list, reduce_op: str, group: ProcessGroup,
                              async_op: bool) -> ScatteredDim0:
    """``reduce_scatter_dim0``'s ScatteredDim0, the collective done (``async_op=False``)
    or under way; the copy into the (n, W) buffer is done here, by the caller."""
    n, r = group.size, group.rank
    stacked, shapes = stack_dim0(fulls, n)                            # (n, sum ...)
    mine = xp.empty(stacked.shape[1], dtype=stacked.dtype)
    work = None
    if n == 1:
        mine[...] = stacked[0]
    elif mine.size:
        _note("reduce_scatter_tensor", group, stacked.nbytes)
        work = reduce_scatter_tensor(mine, stacked, op=REDUCE_OP[reduce_op], group=group,
                                     async_op=async_op)
    return ScatteredDim0(work, lambda: unstack_dim0(mine, shapes, r), shapes, r, mine.dtype)
