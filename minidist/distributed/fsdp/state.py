"""What fully_shard keeps on a unit: its pieces, its gathers, their prefetch, its reduce.

Prefetch (FSDP2's implicit prefetch, on minidist's blocking collectives). A unit's
all-gather is a collective on the communication thread (``async_op=True``,
comm/collectives/work.py, the mechanism ZeRO-3's ``prefetch=True`` uses), so it can
be issued before the unit needs it and travel while another unit computes:

    forward  (order of the first forward: root, block 0, block 1, ...)
        unit i gathers its parameters (or waits for the gather issued earlier),
        then issues unit i+1's gather, then computes; a low-precision policy
        encodes unit i+1's pieces while unit i's gather is still in flight
        (gather_format.py), so only the issue sits between the wait and the compute
    backward (the reverse order)
        the root (which kept its parameters) issues the last unit's gather as soon as
        the first gradient reaches its output, before the head's backward computes;
        unit i gathers again for its recompute, then issues unit i-1's gather,
        then recomputes, backpropagates, and issues its gradients' reduce-scatter,
        left in flight while unit i-1 computes (post_backward.py)

So the order of collectives in a step of root + 2 blocks (reshard_after_forward) is

    forward:   AG root, AG b0, AG b1                 (AG b0 issued before the embeddings run)
    backward:  AG b1, AG b0, RS b1, RS b0, RS root   (AG b1 issued before the head's
                                                      backward; AG b0 before b1's recompute;
                                                      RS b1 travels while b0 computes)

``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` name the
units to prefetch instead of the next / previous one (torch's names). Every rank
issues the same collectives in the same order, so the gathers meet; a gather issued
and then not used (a forward that stopped early) is dropped when the first unit of the
order starts its next forward, so no stale weights outlive the step.

``reshard_after_forward=k`` (an int, a divisor of the mesh's size N: the ranks of one
node): after forward each rank keeps the dim-0 piece of every parameter for a group
of k ranks (the mesh's ranks in blocks of k, torch's ``mesh.view(-1, k)``), so the
backward's all-gather runs within that group: k - 1 pieces of M / k instead of N - 1
of M / N, at the price of M / k bytes held from forward to backward.

In a trace (docs/tracing.md) the prefetched gathers run on the communication thread,
and a span ``FSDP gather unit k (forward|backward)`` on the main thread shows how long
unit k still waited for its weights (as ZeRO-3's ``ZeRO-3 gather unit k``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from minidist import backend
from minidist.backend import xp
from minidist.autograd.recompute import is_recomputing
from minidist.comm.collectives.api import all_gather_into_tensor
from minidist.comm.group import ProcessGroup, new_group, world_group
from minidist.distributed.fsdp.gather_format import (EncodedPieces, encode_pieces, encodes,
                                                     gather_encoded)
from minidist.distributed.fsdp.hsdp import DataParallelMesh, all_reduce_pieces
from minidist.distributed.fsdp.post_backward import (PendingReduce, PostBackward,
                                                     refuse_missing_gradients)
from minidist.distributed.fsdp.reduce_format import (emulated_format,
                                                     start_reduce_scatter_dim0_in_format)
from minidist.distributed.tensor import _collectives as coll
from minidist.distributed.tensor._collectives import ScatteredDim0
from minidist.distributed.tensor._redistribute import DTensorSpec
from minidist.distributed.tensor.placement_types import shard_slice
from minidist.nn.module import Module, Parameter
from minidist.trace import recorder as trace


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Dtypes of the gathered parameters and of the gradients' reduce-scatter (None: the
    parameter's own). "float32" / "float64" are NumPy's; "bfloat16", "float16" and the
    other formats of minidist.precision round the values to the format (the arrays keep
    their dtype; reduce_format.py says where each rounding happens). An emulated
    ``param_dtype`` is cast before the all-gather, which moves its codes (2 bytes an
    element for bfloat16); ``float8_all_gather`` gathers e4m3 codes with a scale per piece
    (torchtitan's enable_fsdp_float8_all_gather; gather_format.py)."""
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    float8_all_gather: bool = False

    def check(self) -> None:
        emulated_format(self.param_dtype)
        emulated_format(self.reduce_dtype)
        if self.float8_all_gather and emulated_format(self.param_dtype) is not None:
            raise ValueError(f"MixedPrecisionPolicy: float8_all_gather gathers e4m3 codes "
                             f"with their scales; param_dtype={self.param_dtype!r} would round "
                             "them again: leave param_dtype None (or float32 / float64)")


class FSDPParam(NamedTuple):
    """One parameter of a unit (torch's FSDPParam): the piece this rank keeps, where the
    modules use the parameter, and its qualified name (torch's ``_param_fqn``: from the
    unit's module, qualified again by each fully_shard of a module around it)."""
    shard: Parameter                      # this rank's dim-0 piece, (ceil(rows / N), ...) or fewer
    uses: list[tuple[Module, str]]        # (module, attribute name): two for a tied parameter
    shape: tuple[int, ...]                # the whole parameter's shape, (rows, ...)
    fqn: str = "?"                        # its name from the outermost fully_shard module


class Schedule:
    """The units of one model in the order their forward first ran (shared by all of
    them; fully_shard on a module joins the schedules of the units inside it). Until one
    forward has run them all, the order is the modules' (the root, then the units inside
    it as ``modules()`` lists them), so the first step prefetches too."""

    def __init__(self, state: "FSDPState"):
        self.states = [state]
        self.order: list[FSDPState] = []
        self.post_backward = PostBackward()      # the reduces of a backward, in flight

    def join(self, other: "Schedule") -> None:
        for state in other.states:
            state.schedule = self
            self.states.append(state)

    def sequence(self) -> list["FSDPState"]:
        units = [state for state in self.states if state.params]
        return self.order if len(self.order) == len(units) else units

    def neighbour(self, state: "FSDPState", step: int) -> list["FSDPState"]:
        seq = self.sequence()
        if state not in seq:
            return []
        k = seq.index(state) + step
        return [seq[k]] if 0 <= k < len(seq) else []


class FSDPState:
    """What fully_shard keeps on a module: its mesh, its parameters' pieces and where
    they are used (a tied parameter is used by two modules), the gathers under way."""

    def __init__(self, dp: DataParallelMesh, reshard_after_forward: bool | int,
                 mp_policy: MixedPrecisionPolicy):
        self.mesh, self.mp_policy = dp.mesh, mp_policy
        self.shard_group = dp.shard_group              # gathers and reduce-scatters
        self.replicate_group = dp.replicate_group      # HSDP: all-reduces the pieces
        self.placements = dp.placements                # of every parameter of the unit
        self.reshard_after_forward = reshard_after_forward is not False
        self.post_group = None if isinstance(reshard_after_forward, bool) \
            else post_forward_group(self.shard_group, reshard_after_forward)
        self.post_forward: list[Any] | None = None   # pieces for post_group, forward to backward
        self.params: list[FSDPParam] = []
        self.requires_gradient_sync = True
        self.unsharded_grads: list[Any] | None = None   # accumulated while sync is off
        self.is_root = False
        self.awaits_backward = 0                     # resharded forwards whose backward is due
        self.schedule = Schedule(self)
        self.forward_prefetch: list[FSDPState] | None = None    # None: the next in order
        self.backward_prefetch: list[FSDPState] | None = None   # None: the previous one
        self.pending: tuple[str, coll.GatheredDim0] | None = None  # (phase, gather under way)
        self.encoded: EncodedPieces | None = None   # the forward's codes, for the backward's gather

    def spec(self, shape: tuple[int, ...]) -> DTensorSpec:
        return DTensorSpec(self.mesh, self.placements, shape)

    def shards(self) -> list[Parameter]:
        return [param.shard for param in self.params]

    def put(self, values: list[Any]) -> None:
        """Make the modules use ``values`` (gathered tensors, or the shards back)."""
        for value, param in zip(values, self.params):
            for module, name in param.uses:
                module.put_in_place(name, value)

    def reshard(self) -> None:
        """Make the modules use the pieces again (the gathered parameters are dropped)."""
        self.put(self.shards())

    # -- gathering, with prefetch --------------------------------------------------
    def _start(self, phase: str, async_op: bool, encoded: EncodedPieces | None = None) -> Any:
        """Start (or, not ``async_op``, do) the unit's all-gather for ``phase``, of the
        codes ``encode`` gives (or ``encoded``, made by it earlier) where the policy
        gathers in a low-precision format (gather_format.py)."""
        lengths = [param.shape[0] for param in self.params]
        if phase == "backward" and self.post_group is not None:
            return coll.all_gather_dim0(self.post_forward, lengths, self.post_group, async_op)
        if encoded is None:
            encoded = self.encode(phase)
        if encoded is None:                                 # gathered as they are
            return coll.all_gather_dim0([s.data for s in self.shards()], lengths,
                                        self.shard_group, async_op)
        if phase == "forward" and self.reshard_after_forward:
            self.encoded = encoded                          # for the backward's gather
        return gather_encoded(encoded, self.shard_group, async_op)

    def encode(self, phase: str) -> EncodedPieces | None:
        """The pieces in the policy's gather format for ``phase``'s gather (None: gathered
        as they are), once a step: the forward's codes serve the backward's gather (the
        parameters are the forward's until the optimizer steps, after the backward)."""
        if phase == "backward" and self.post_group is not None:
            return None                                     # gathers what forward kept
        encoded, self.encoded = self.encoded, None
        if phase == "forward" or encoded is None:
            lengths = [param.shape[0] for param in self.params]
            encoded = encode_pieces([s.data for s in self.shards()], lengths,
                                    self.shard_group.size, self.mp_policy)
        return encoded

    def gather(self, phase: str = "forward", keep: bool = False) -> list[Any]:
        """Every parameter of the unit whole (arrays), by one all-gather (or the one
        issued ahead for this phase); then issue the prefetch of the unit(s) after it.
        ``keep``: a resharding forward, which keeps the pieces backward will gather."""
        if phase == "forward" and self.schedule.sequence()[:1] == [self]:
            for state in self.schedule.states:          # a new step: nothing stale survives
                state.drop_pending()
        if phase == "forward" and self not in self.schedule.order:
            self.schedule.order.append(self)
        start = time.perf_counter()
        pending, self.pending = self.pending, None
        prefetched = pending is not None and pending[0] == phase
        if pending is not None and not prefetched:
            pending[1].wait()
        issues = not (phase == "forward" and is_recomputing())   # (the next unit is done with)
        targets = self.prefetch_targets(phase) if issues else []
        encodes_ahead = bool(targets) and encodes(self.mp_policy)
        gathering = pending[1] if prefetched else self._start(phase, async_op=encodes_ahead)
        # the next units' codes made while this unit's gather is in flight, not between
        # its wait and its use (FSDP2 copies in on the all-gather's own stream)
        ahead = {t: t.encode(phase) for t in targets} if encodes_ahead else {}
        fulls = gathering.wait() if prefetched or encodes_ahead else gathering
        if trace.active is not None:   # how long this unit still waited for its weights
            unit = self.schedule.sequence().index(self) if self.params else -1
            trace.active.span(f"FSDP gather unit {unit} ({phase})", "zero", start,
                              time.perf_counter(), dict(prefetched=prefetched))
        if keep:
            self.keep_post_forward(fulls)
        for target in targets:
            target.pending = (phase, target._start(phase, True, ahead.get(target)))
        if emulated_format(self.mp_policy.param_dtype) is not None:
            return fulls        # already the format's values: rounded before the gather
        dtype = self.mp_policy.param_dtype
        return fulls if dtype is None else [f.astype(dtype) for f in fulls]

    def prefetch_targets(self, phase: str) -> list["FSDPState"]:
        """The units whose gathers to issue, asynchronously, after this one's: those named
        by set_modules_to_*_prefetch, else the next (forward) / previous (backward) unit,
        less those already under way. The root's forward ends after every unit inside it
        (FSDP2's post-forward order), so in backward its previous unit is the last one."""
        if phase == "forward":
            targets = self.forward_prefetch
            if targets is None:
                targets = self.schedule.neighbour(self, +1)
        else:
            targets = self.backward_prefetch
            if targets is None:
                targets = self.schedule.sequence()[-1:] if self.is_root \
                    else self.schedule.neighbour(self, -1)
            targets = [t for t in targets if t.awaits_backward]
        return [t for t in targets if t.pending is None and t is not self]

    def pre_backward(self) -> None:
        """FSDP2's pre-backward of a unit that kept its parameters from forward (the root,
        or reshard_after_forward=False): the first gradient to reach its output issues the
        backward gathers of the units before it, so that the last block's gather travels
        while the head's backward computes instead of after it."""
        for target in self.prefetch_targets("backward"):
            target.pending = ("backward", target._start("backward", True))

    def drop_pending(self) -> None:
        if self.pending is not None:
            self.pending[1].wait()
            self.pending = None

    def keep_post_forward(self, fulls: list[Any]) -> None:
        """reshard_after_forward=k: keep this rank's dim-0 piece of each gathered
        parameter for its group of k (what backward gathers within that group)."""
        if self.post_group is not None:
            k, r = self.post_group.size, self.post_group.rank
            self.post_forward = [xp.ascontiguousarray(shard_slice(f, 0, k, r)) for f in fulls]

    # -- reducing ---------------------------------------------------------------------
    def reduce_or_keep(self, grads: list[Any]) -> None:
        """With gradient sync on: issue the reduce-scatter of (grads + what was kept), left
        in flight while the units before this one compute their backward; the pieces land
        in the shards' ``.grad`` when the backward is done (post_backward.py). Off: add the
        whole gradients to what is kept (no communication; the next synced backward
        reduce-scatters the sum). ``grads``: one per parameter of the unit (None for one the
        unit's forward did not use: refused, post_backward.py); those of frozen
        parameters (``requires_grad=False``, the same on every rank) are dropped, so a
        frozen parameter gets no ``.grad`` and no optimizer moves it (FSDP2 reduces the
        parameters with a gradient only)."""
        trained = [param.shard.requires_grad for param in self.params]
        refuse_missing_gradients(self.params, grads)
        grads = [g for g, keep in zip(grads, trained) if keep]
        if not grads:
            return
        if self.unsharded_grads is not None:
            grads = [g + kept for g, kept in zip(grads, self.unsharded_grads)]
        if not self.requires_gradient_sync:
            self.unsharded_grads = grads
            return
        self.unsharded_grads = None
        post_backward = self.schedule.post_backward
        post_backward.wait_in_flight()      # before the copy-in: one in flight at a time
        shards = [s for s, keep in zip(self.shards(), trained) if keep]
        post_backward.issue(PendingReduce(shards, self.start_reduce(grads),
                                          self.schedule.sequence().index(self)))

    def start_reduce(self, grads: list[Any], async_op: bool = True) -> ScatteredDim0:
        """This rank's pieces of the mean over ranks of every gradient, by one
        reduce-scatter over the shard group (in ``reduce_dtype`` if the policy names one);
        HSDP: then one all-reduce of the pieces over the replicas (hsdp.py). Under way on
        the communication thread (``async_op``) until the ScatteredDim0's ``wait()``."""
        group = self.shard_group
        fmt = emulated_format(self.mp_policy.reduce_dtype)
        if fmt is not None:
            scattered = start_reduce_scatter_dim0_in_format(grads, "avg", group, fmt, async_op)
        else:
            dtype = self.mp_policy.reduce_dtype or self.params[0].shard.dtype
            scattered = coll.start_reduce_scatter_dim0([g.astype(dtype) for g in grads], "avg",
                                                       group, async_op)
        if self.replicate_group is not None:
            scattered = all_reduce_pieces(scattered, self.replicate_group, fmt, async_op)
        return scattered


def post_forward_group(shard_group: ProcessGroup, size: int) -> ProcessGroup:
    """This rank's group of ``size`` for reshard_after_forward=size: the ranks of its
    shard group in blocks of ``size``. Every rank of the world builds every such group
    (new_group's rule), so the shard groups of all ranks are gathered first (one
    all-gather of rank lists)."""
    n = shard_group.size
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= n \
            or n % size:
        raise ValueError(f"reshard_after_forward={size!r}: an int must divide the {n} ranks "
                         "that shard (the ranks of a node, say); use True or False otherwise")
    world = world_group()
    mine = xp.asarray(list(shard_group.ranks), dtype="int64")                 # (n,)
    everyone = xp.empty((world.size, n), dtype="int64")                       # (world, n)
    all_gather_into_tensor(everyone, mine, group=world)
    meshes = []
    for row in backend.to_host(everyone).tolist():
        if row not in meshes:
            meshes.append(row)
    group = None
    for ranks in meshes:
        for start in range(0, n, size):
            block = ranks[start:start + size]
            made = world if len(block) == world.size else new_group(block)
            if world.rank in block:
                group = made
    return group
