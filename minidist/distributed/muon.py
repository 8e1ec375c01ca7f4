"""Sharded Muon: bring each matrix's pieces together for the Newton-Schulz iteration.

Muon's momentum and its final step are elementwise, so a rank holding a piece of a
weight W (A, B) does them on its piece alone. The iteration O = NS_k(U) is not: it
needs the whole U (optim/muon.py). Two ways to get it, for M matrices of P = A B
elements each, cut over N ranks, k steps (FLOPs of one iteration on a wide
A <= B matrix: k (2 A^2 B + 2 A^3 + 2 A^2 B) = k (4 A^2 B + 2 A^3)):

    "gather"        each matrix all-gathered on every rank (padded to its largest
    (Moonlight's      piece), every rank iterates on it and keeps its own piece.
     ZeRO-1 scheme)   bytes sent per rank per matrix: (N - 1) max-piece
                      iterations in the world per step: N M  (N times the FLOPs)
    "round_robin"   matrix i owned by rank i mod N of its group: one all-to-all sends
    (torchtitan's     each piece to its owner, the owner iterates once, a second
     dist_muon,       all-to-all sends each rank its piece of O back.
     Dion)            bytes sent per rank per step: ~ 2 (N - 1) / N of its pieces' bytes
                      iterations in the world per step: M  (each matrix once)

Both give each rank its piece of the O one process computes from the whole matrix:
the same arithmetic on the same assembled U, so the parameters train as one process's
(float64, to the last bits; tests/distributed/test_sharded_muon.py).

Where the pieces are: ``MatrixPieces`` lists, for each rank of the group, which
elements of the row-major whole matrix its piece holds, in the order the piece holds
them (a slice, or an index array for a piece that is not one block of the flat
matrix: a column slice, a fused weight's heads). ``fully_shard_pieces`` reads them
from fully_shard (torch.chunk's rows), ``tensor_parallel_pieces`` from a
parallelize_module plan, parallel/zero/muon.py from ZeRO's flat shards.
``calc.muon_step_costs`` gives both schemes' bytes and FLOPs; bench/bench_muon.py
times them. Demo: demos/26_muon.py.
"""
from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from minidist.autograd.pieces import piece_layout
from minidist.backend import xp
from minidist.comm.collectives.api import all_gather_into_tensor, all_to_all_single
from minidist.comm.group import resolve
from minidist.distributed.tensor.placement_types import Shard, shard_slice
from minidist.optim.muon import MatrixUpdate, Muon, newton_schulz

SCHEMES = ("gather", "round_robin")


class MatrixPieces(NamedTuple):
    """How one matrix is cut over the ranks of a group."""
    shape: tuple          # the whole matrix (A, B)
    group: Any            # the ProcessGroup whose ranks hold the pieces (None: the world)
    where: list           # per group rank: the flat indices of the whole it holds, in its order

    def size(self, rank: int) -> int:
        """Elements rank ``rank``'s piece holds."""
        index = self.where[rank]
        if isinstance(index, slice):
            return index.stop - index.start
        return int(index.size)


def row_chunks(shape: tuple, group: Any) -> MatrixPieces:
    """The pieces of a Shard(0) matrix: torch.chunk's rows (ceil(A / N) each, the last
    ranks fewer or none), each one block of the flat whole."""
    n = resolve(group).size
    rows, cols = shape
    where = []
    for r in range(n):
        part = shard_slice(xp.arange(rows), 0, n, r)
        start = int(part[0]) if part.size else rows
        where.append(slice(start * cols, (start + int(part.size)) * cols))
    return MatrixPieces(tuple(shape), group, where)


def assemble(pieces: MatrixPieces, parts: list) -> Any:
    """The whole (A, B) matrix from every rank's piece, flattened, in group rank order."""
    whole = xp.empty(pieces.shape[0] * pieces.shape[1], dtype=parts[0].dtype)   # (A B,)
    for index, part in zip(pieces.where, parts):
        whole[index] = part
    return whole.reshape(pieces.shape)


def piece_of(pieces: MatrixPieces, whole: Any, rank: int) -> Any:
    """Rank ``rank``'s piece of the whole matrix, flat."""
    return whole.reshape(-1)[pieces.where[rank]]


class ShardedMuon(Muon):
    """Muon on parameters that are pieces of matrices (module docstring).

    ``pieces``: id(parameter) -> ``MatrixPieces`` for each parameter that is a piece;
    the others are whole matrices, iterated where they are. ``scheme``: "gather" or
    "round_robin". Every rank of a group must step the same matrices in the same order
    (the same model, the same param groups). ``iterations_run`` counts this rank's
    Newton-Schulz iterations.
    """

    def __init__(self, params: Iterable[Any], pieces: dict, scheme: str = "round_robin",
                 **muon_kwargs: Any):
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        self.pieces, self.scheme = dict(pieces), scheme
        super().__init__(params, **muon_kwargs)

    def whole_shape(self, p: Any) -> tuple:
        found = self.pieces.get(id(p))
        return tuple(p.shape) if found is None else found.shape

    def knows_pieces(self, p: Any) -> bool:
        """Whether ``pieces`` says how ``p`` is cut, over every group that cuts it (a
        matrix cut twice, tensor parallel then fully_shard, is not brought together by
        one group's pieces)."""
        found = self.pieces.get(id(p))
        if found is None:
            return False
        layout = piece_layout(p)
        cuts = [tuple(resolve(g).ranks) for g in (layout.tensor_groups if layout else [])]
        return cuts in ([], [tuple(resolve(found.group).ranks)])

    def matrices(self, p: Any, update: Any) -> list[MatrixUpdate]:
        return [MatrixUpdate(p.data, update, self.whole_shape(p), self.pieces.get(id(p)))]

    def _orthogonalize(self, items: list[MatrixUpdate], group: dict) -> list:
        ns = dict(coefficients=group["ns_coefficients"], steps=group["ns_steps"],
                  eps=group["eps"], ns_dtype=group["ns_dtype"])
        orthos: list = [None] * len(items)
        by_group: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            if item.pieces is None:
                orthos[i] = self._iterate(item.update, ns)
            else:
                by_group.setdefault(id(resolve(item.pieces.group)), []).append(i)
        for indices in by_group.values():
            chosen = [items[i] for i in indices]
            if self.scheme == "gather":
                done = [self._gathered(item, ns) for item in chosen]
            else:
                done = self._round_robin(chosen, ns)
            for i, ortho in zip(indices, done):
                orthos[i] = ortho.reshape(items[i].target.shape)
        return orthos

    def _iterate(self, update: Any, ns: dict) -> Any:
        self.iterations_run += 1
        return newton_schulz(update, **ns)

    def _gathered(self, item: MatrixUpdate, ns: dict) -> Any:
        """Scheme "gather": all-gather the pieces (padded to the largest), iterate, keep mine."""
        pieces = item.pieces
        g = resolve(pieces.group)
        sizes = [pieces.size(r) for r in range(g.size)]
        width = max(sizes)
        mine = xp.zeros(width, dtype=item.update.dtype)                       # (max piece,)
        mine[:sizes[g.rank]] = item.update.reshape(-1)
        every = xp.empty(g.size * width, dtype=mine.dtype)                    # (N max piece,)
        all_gather_into_tensor(every, mine, group=g)
        parts = [every[r * width:r * width + sizes[r]] for r in range(g.size)]
        ortho = self._iterate(assemble(pieces, parts), ns)
        return piece_of(pieces, ortho, g.rank)

    def _round_robin(self, items: list[MatrixUpdate], ns: dict) -> list:
        """Scheme "round_robin": matrix i to rank i mod N (all-to-all), iterated once
        there, each piece of O sent back to its holder (all-to-all)."""
        g = resolve(items[0].pieces.group)
        n, me = g.size, g.rank
        owner = [i % n for i in range(len(items))]
        mine = [i for i in range(len(items)) if owner[i] == me]
        # there: rank r sends its pieces of the matrices rank d owns, matrix by matrix
        send = [[items[i].update.reshape(-1) for i in range(len(items)) if owner[i] == d]
                for d in range(n)]
        recv_sizes = [[items[i].pieces.size(s) for i in mine] for s in range(n)]
        received = _exchange(g, send, recv_sizes, items[0].update.dtype)
        # iterate on the matrices this rank owns
        orthos = {}
        for k, i in enumerate(mine):
            whole = assemble(items[i].pieces, [received[s][k] for s in range(n)])
            orthos[i] = self._iterate(whole, ns)
        # back: the owner sends each rank its piece of O
        send = [[piece_of(items[i].pieces, orthos[i], d) for i in mine] for d in range(n)]
        recv_sizes = [[items[i].pieces.size(me) for i in range(len(items)) if owner[i] == s]
                      for s in range(n)]
        returned = _exchange(g, send, recv_sizes, items[0].update.dtype)
        out, taken = [], [0] * n
        for i in range(len(items)):
            out.append(returned[owner[i]][taken[owner[i]]])
            taken[owner[i]] += 1
        return out


def _exchange(g: Any, send: list[list], recv_sizes: list[list[int]], dtype: Any) -> list:
    """One all_to_all_single: ``send[d]`` (flat parts) to rank d; returns, per source
    rank s, the parts it sent this rank, cut by ``recv_sizes[s]``."""
    outgoing = [xp.concatenate(parts).astype(dtype) if parts else xp.empty(0, dtype=dtype)
                for parts in send]
    flat_in = xp.concatenate(outgoing)
    totals = [sum(sizes) for sizes in recv_sizes]
    flat_out = xp.empty(sum(totals), dtype=dtype)
    all_to_all_single(flat_out, flat_in, output_split_sizes=totals,
                      input_split_sizes=[int(o.size) for o in outgoing], group=g)
    parts, start = [], 0
    for sizes in recv_sizes:
        mine = []
        for size in sizes:
            mine.append(flat_out[start:start + size])
            start += size
        parts.append(mine)
    return parts


def fully_shard_pieces(module: Any) -> dict:
    """id(piece) -> ``MatrixPieces`` for every matrix parameter that ``fully_shard`` cut
    in ``module`` (its units and the root): torch.chunk's rows over the unit's mesh."""
    found = {}
    for m in module.modules():
        state = m.__dict__.get("_fsdp_state")
        if state is None:
            continue
        for param in state.params:
            if len(param.shape) == 2:
                found[id(param.shard)] = row_chunks(param.shape, state.shard_group)
    return found


def tensor_parallel_pieces(module: Any) -> dict:
    """id(piece) -> ``MatrixPieces`` for every matrix a parallelize_module plan cut over
    one mesh dimension (ColwiseParallel: rows; RowwiseParallel: columns; a fused weight
    read as its (3, out, in) stack: each rank's rows of q, k and v)."""
    found = {}
    for _, m in module.named_modules():
        for name, (mesh, placements, shape) in m.__dict__.get("_dtensor_placements",
                                                             {}).items():
            cuts = [(dim, p) for dim, p in enumerate(placements) if isinstance(p, Shard)]
            if len(shape) not in (2, 3) or not cuts:
                continue
            if len(cuts) > 1:
                raise ValueError(f"{name}: cut over {len(cuts)} mesh dimensions; sharded "
                                 "Muon takes pieces cut over one group")
            mesh_dim, placement = cuts[0]
            n = mesh.size(mesh_dim)
            flat = xp.arange(_numel(shape)).reshape(shape)
            where = [shard_slice(flat, placement.dim, n, r).reshape(-1) for r in range(n)]
            matrix = (_numel(shape[:-1]), shape[-1])       # a stack (3, out, in): (3 out, in)
            found[id(getattr(m, name))] = MatrixPieces(matrix, mesh.get_group(mesh_dim), where)
    return found


def _numel(shape: tuple) -> int:
    total = 1
    for s in shape:
        total *= s
    return total
