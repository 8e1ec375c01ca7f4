"""DTensor: a tensor spread over a DeviceMesh, one placement per mesh dimension.

    mesh = init_device_mesh("cpu", (4,))
    w = distribute_tensor(full_w, mesh, [Shard(0)])   # rank r holds rows of piece r
    w.to_local()                                      # my piece, an autograd Tensor
    w.redistribute(mesh, [Replicate()])               # all-gather: every rank has all
    w.full_tensor()                                   # the same, as a plain Tensor

A DTensor holds its local piece (an autograd ``Tensor``), its mesh, its
placements and the global shape. ``redistribute`` changes the placements with
minidist's collectives (_redistribute.py) and is differentiable: its backward
moves the gradient back, as the adjoint collective. Gradients carry placements
too (``GradPlacements``); a gradient's default placements are the tensor's
with Partial read as Replicate, and ``to_local(grad_placements=...)`` declares
what the local gradient will be (``[Partial()]`` for a local sum that the
other ranks' parts complete).

The invariant: for every placements P, ``redistribute(mesh, P).full_tensor()``
is the global tensor, bit for bit where no sum is reordered.
"""
from __future__ import annotations

from typing import Any, Sequence

from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import from_host, to_host, xp
from minidist.comm.collectives.api import all_gather_into_tensor, broadcast
from minidist.distributed.tensor._collectives import backward_phase
from minidist.distributed.tensor._redistribute import (DTensorSpec, GradPlacements, Redistribute,
                                                       deliver_grad, normalize_for_grad,
                                                       redistribute_local)
from minidist.distributed.tensor.placement_types import (Partial, Placement, Replicate, Shard,
                                                          chunk_sizes, normalize_dim)


_FUNCTIONAL = ("softmax", "log_softmax", "layer_norm", "rms_norm", "embedding",
               "cross_entropy")


def _ops() -> Any:
    """The rules (imported late: they build DTensors with this module's class)."""
    from minidist.distributed.tensor import _ops as ops
    return ops


def _check_placements(placements: Sequence[Placement] | None, mesh: Any, ndim: int,
                      what: str) -> tuple[Placement, ...]:
    """Placements as a tuple with Shard dims made non-negative, or a clear error."""
    if placements is None:
        return tuple(Replicate() for _ in range(mesh.ndim))
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(f"{what}: {len(placements)} placements {list(placements)} for a mesh "
                         f"of {mesh.ndim} dimensions {mesh.shape}: give one per mesh dimension")
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"{what}: {p!r} is not a placement (Shard(dim), Replicate(), "
                            "Partial())")
        out.append(Shard(normalize_dim(p.dim, ndim, what)) if isinstance(p, Shard) else p)
    ops = {p.reduce_op for p in out if isinstance(p, Partial)}
    if len(ops) > 1 and not ops <= {"sum", "avg"}:
        # max does not commute with sum: the order of the reductions would change the tensor
        raise ValueError(f"{what}: placements {list(out)} mix Partial reductions {sorted(ops)}; "
                         "only sum and avg may be mixed")
    return tuple(out)


class DTensor:
    """A distributed tensor (module docstring). Make one with ``distribute_tensor`` or
    ``DTensor.from_local``, not with this constructor."""

    def __init__(self, local_tensor: Tensor, spec: DTensorSpec,
                 grad_box: GradPlacements | None = None):
        self._local_tensor = local_tensor
        self._spec = spec
        self._grad_box = grad_box if grad_box is not None else GradPlacements()

    # -- what it is ---------------------------------------------------------
    @property
    def device_mesh(self) -> Any:
        return self._spec.mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        return self._spec.placements

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def ndim(self) -> int:
        return len(self._spec.shape)

    @property
    def dtype(self) -> Any:
        return self._local_tensor.dtype

    @property
    def requires_grad(self) -> bool:
        return self._local_tensor.requires_grad

    @property
    def grad(self) -> "DTensor | None":
        """The gradient, as a DTensor with the placements it was accumulated in."""
        g = self._local_tensor.grad
        if g is None:
            return None
        placements = self._grad_box.placements or normalize_for_grad(self.placements)
        return DTensor(Tensor(g), DTensorSpec(self.device_mesh, placements, self.shape))

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return (f"DTensor(local_tensor={self._local_tensor!r}, device_mesh={self.device_mesh!r}, "
                f"placements={self.placements})")

    # -- moving it ----------------------------------------------------------
    def redistribute(self, device_mesh: Any = None,
                     placements: Sequence[Placement] | None = None) -> "DTensor":
        """The same tensor laid out as ``placements`` (collectives on the mesh's groups)."""
        mesh = self.device_mesh if device_mesh is None else device_mesh
        if mesh != self.device_mesh:
            raise ValueError(f"redistribute: cannot move a DTensor from {self.device_mesh} to "
                             f"another mesh {mesh}; redistribute works within one mesh")
        placements = _check_placements(placements, mesh, self.ndim, "redistribute")
        if placements == self.placements:
            return self                      # nothing moves, forward or backward
        dst = DTensorSpec(mesh, placements, self.shape)
        box = GradPlacements()
        local = Redistribute.apply(self._local_tensor, src=self._spec, dst=dst,
                                   src_box=self._grad_box, dst_box=box)
        return DTensor(local, dst, box)

    def to_local(self, *, grad_placements: Sequence[Placement] | None = None) -> Tensor:
        """This rank's piece, an autograd Tensor. Its gradient is read as laid out by
        ``grad_placements`` (default: the DTensor's placements, Partial as Replicate)."""
        if grad_placements is not None:
            grad_placements = _check_placements(grad_placements, self.device_mesh, self.ndim,
                                                "to_local(grad_placements)")
        if not self._local_tensor.requires_grad:
            return self._local_tensor
        return _ToLocal.apply(self._local_tensor, spec=self._spec, box=self._grad_box,
                              grad_placements=grad_placements)

    def full_tensor(self, *, grad_placements: Sequence[Placement] | None = None) -> Tensor:
        """The whole tensor on every rank (all-gathers and all-reduces as needed)."""
        whole = self.redistribute(self.device_mesh, [Replicate()] * self.device_mesh.ndim)
        return whole.to_local(grad_placements=grad_placements)

    def item(self) -> float:
        """The one element as a Python float, from the whole tensor (torch's ``item``
        on a DTensor: a loss under ``loss_parallel`` is a Replicate DTensor)."""
        return self.full_tensor().item()

    def backward(self, grad: Any = None) -> None:
        self._local_tensor.backward(grad)

    # -- ops, by sharding propagation (_ops/, whose docstrings hold the rules) ------------
    def __matmul__(self, other: "DTensor") -> "DTensor":
        return _ops().matmul(self, other)

    def __add__(self, other: "DTensor") -> "DTensor":
        return _ops().elementwise("add", self, other)

    def __sub__(self, other: "DTensor") -> "DTensor":
        return _ops().elementwise("sub", self, other)

    def __mul__(self, other: "DTensor") -> "DTensor":
        return _ops().elementwise("mul", self, other)

    def sum(self, dim: Any = None, keepdim: bool = False) -> "DTensor":
        return _ops().reduction("sum", self, dim, keepdim)

    def mean(self, dim: Any = None, keepdim: bool = False) -> "DTensor":
        return _ops().reduction("mean", self, dim, keepdim)

    def softmax(self, dim: int = -1) -> "DTensor":
        return _ops().softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> "DTensor":
        return _ops().log_softmax(self, dim)

    def reshape(self, *shape: Any) -> "DTensor":
        return _ops().reshape(self, *shape)

    def view(self, *shape: Any) -> "DTensor":
        """As reshape, but refuses (as torch's strict view) where a cut dim would move."""
        return _ops().reshape(self, *shape, strict=True)

    def permute(self, *dims: Any) -> "DTensor":
        return _ops().permute(self, *dims)

    def transpose(self, dim0: int, dim1: int) -> "DTensor":
        return _ops().transpose(self, dim0, dim1)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any = (), args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        """``minidist.nn.functional``'s functions given a DTensor come here (torch's protocol
        for tensor-likes): the rule of the same name in _ops/, or a clear error."""
        rule = getattr(_ops(), func.__name__, None)
        if rule is None or func.__name__ not in _FUNCTIONAL:
            raise TypeError(f"F.{func.__name__} has no sharding rule for DTensors; call "
                            ".full_tensor() (or .to_local()) first")
        return rule(*args, **(kwargs or {}))

    @staticmethod
    def from_local(local_tensor: Any, device_mesh: Any = None,
                   placements: Sequence[Placement] | None = None, *, run_check: bool = False,
                   shape: Sequence[int] | None = None) -> "DTensor":
        """Wrap this rank's piece. Without ``shape`` the pieces are taken to be even (the
        global shape is the local one times the mesh size along each Shard). With
        ``run_check`` the ranks compare their local shapes (an error names the ranks that
        disagree) and Replicate pieces are made equal by a broadcast from coordinate 0."""
        if device_mesh is None:
            raise ValueError("from_local needs device_mesh (init_device_mesh makes one)")
        local = local_tensor if isinstance(local_tensor, Tensor) else Tensor(local_tensor)
        placements = _check_placements(placements, device_mesh, local.ndim, "from_local")
        if shape is None:
            global_shape = list(local.shape)
            for n, p in zip(device_mesh.shape, placements):
                if isinstance(p, Shard):
                    global_shape[p.dim] *= n
            shape = tuple(global_shape)
        spec = DTensorSpec(device_mesh, placements, tuple(int(s) for s in shape))
        if run_check:
            _check_local_shapes(local, spec)
        elif tuple(local.shape) != spec.local_shape():
            raise ValueError(f"from_local: local tensor of shape {tuple(local.shape)} is not "
                             f"this rank's piece {spec.local_shape()} of {spec.shape} laid out "
                             f"as {list(placements)}; pass shape= for uneven pieces")
        box = GradPlacements()
        if not local.requires_grad:
            return DTensor(local, spec, box)
        return DTensor(_FromLocal.apply(local, spec=spec, box=box), spec, box)


class _ToLocal(Function):
    """Forward the piece as it is; backward hands the gradient to the DTensor."""

    @staticmethod
    def forward(ctx, local, *, spec, box, grad_placements):
        ctx.spec, ctx.box = spec, box
        ctx.grad_placements = grad_placements or normalize_for_grad(spec.placements)
        return local

    @staticmethod
    def backward(ctx, grad):
        with backward_phase():
            return deliver_grad(grad, ctx.spec, ctx.grad_placements, ctx.box)


class _FromLocal(Function):
    """Forward wraps the piece; backward returns the gradient laid out as the piece was
    (Partial read as Replicate), redistributing it if it arrives otherwise."""

    @staticmethod
    def forward(ctx, local, *, spec, box):
        ctx.spec, ctx.box = spec, box
        return local

    @staticmethod
    def backward(ctx, grad):
        arriving = ctx.box.placements or normalize_for_grad(ctx.spec.placements)
        wanted = normalize_for_grad(ctx.spec.placements)
        if arriving == wanted:
            return grad
        with backward_phase():
            return redistribute_local(grad, DTensorSpec(ctx.spec.mesh, arriving, ctx.spec.shape),
                                      wanted)


def _check_local_shapes(local: Tensor, spec: DTensorSpec) -> None:
    """from_local(run_check=True): every mesh dimension's ranks compare their local shapes
    (all-gathered), and Replicate pieces are broadcast from coordinate 0."""
    mesh = spec.mesh
    if local.ndim > 8:
        raise ValueError("from_local(run_check=True) checks tensors of up to 8 dimensions")
    mine = from_host([local.ndim] + list(local.shape) + [0] * (8 - local.ndim), "int64")
    for i, p in enumerate(spec.placements):
        group = mesh.get_group(i)
        shapes = xp.empty((group.size, 9), dtype="int64")
        all_gather_into_tensor(shapes, mine, group=group)
        seen = [tuple(int(v) for v in row[1:1 + int(row[0])]) for row in to_host(shapes).tolist()]
        ranks = group.ranks
        others = [[s for d, s in enumerate(shape) if not (isinstance(p, Shard) and d == p.dim)]
                  for shape in seen]
        if any(o != others[0] for o in others) or any(len(s) != len(seen[0]) for s in seen):
            raise ValueError(f"from_local: the local tensors along mesh dim {i} ({p}) disagree: "
                             + ", ".join(f"rank {r}: {s}" for r, s in zip(ranks, seen)))
        if isinstance(p, Shard):
            rows = [s[p.dim] for s in seen]
            if rows != chunk_sizes(sum(rows), group.size):
                raise ValueError(f"from_local: the pieces along mesh dim {i} ({p}) have "
                                 f"{rows} rows on ranks {ranks}, not torch.chunk's pieces "
                                 f"{chunk_sizes(sum(rows), group.size)} of {sum(rows)} rows")
        elif p.is_replicate() and group.size > 1:
            broadcast(local.data, src=ranks[0], group=group)
    if tuple(local.shape) != spec.local_shape():
        raise ValueError(f"from_local: local tensor of shape {tuple(local.shape)} is not this "
                         f"rank's piece {spec.local_shape()} of {spec.shape} laid out as "
                         f"{list(spec.placements)}")


def distribute_tensor(tensor: Any, device_mesh: Any = None,
                      placements: Sequence[Placement] | None = None, *,
                      src_data_rank: int | None = 0) -> DTensor:
    """Spread a whole tensor over the mesh as ``placements``. With ``src_data_rank=0`` the
    tensor of the mesh's first rank is what gets spread (broadcast along every mesh dim);
    with None every rank cuts its own copy (they must be equal). A leaf: it requires
    grad if ``tensor`` does, and its gradient has its placements (Partial as Replicate)."""
    if device_mesh is None:
        raise ValueError("distribute_tensor needs device_mesh (init_device_mesh makes one)")
    full = tensor if isinstance(tensor, Tensor) else Tensor(tensor)
    placements = _check_placements(placements, device_mesh, full.ndim, "distribute_tensor")
    data = full.data
    if src_data_rank is not None:
        if src_data_rank != 0:
            raise ValueError("distribute_tensor: src_data_rank must be 0 or None")
        data = data.copy()                           # C order, 0-d stays 0-d
        for i in range(device_mesh.ndim):
            group = device_mesh.get_group(i)
            if group.size > 1 and data.size:
                broadcast(data, src=group.ranks[0], group=group)
    whole = DTensorSpec(device_mesh, tuple(Replicate() for _ in placements), tuple(full.shape))
    local = redistribute_local(data, whole, placements).copy()
    spec = DTensorSpec(device_mesh, placements, tuple(full.shape))
    box = GradPlacements(normalize_for_grad(placements), fixed=True)
    return DTensor(Tensor(local, requires_grad=full.requires_grad), spec, box)
