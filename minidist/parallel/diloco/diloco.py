"""``DiLoCo``: H local steps per replica, then one averaged outer step (torchft's API).

DiLoCo (Douillard et al. 2023, arXiv 2311.08105, Algorithm 1). Every replica i
keeps the last synchronised parameters theta_global and trains on its own data
with its own inner optimizer (AdamW) for H = ``sync_every`` steps. Then:

    Delta   = (1/N) sum_i (theta_global - theta_i)     the outer gradient (all-reduce AVG)
    theta_global <- OuterOpt(theta_global, Delta)      e.g. SGD(lr=0.7, momentum=0.9,
    theta_i <- theta_global                             nesterov=True)

The replicas talk once every H steps instead of every step: 2(N-1)/N * M bytes per
rank per round, H times fewer than DDP. With H = 1, inner SGD(lr) and outer
SGD(lr=1) it is DDP: theta - lr * mean(g_i).

Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512) splits the model into F
``fragments`` that synchronise in turn (schedule.py), each overlapped with tau =
``fragment_sync_delay`` further inner steps and mixed back in with alpha =
``fragment_update_alpha``; the outer gradient may travel in a low precision format
(``outer_grad_format``, outer_grad.py). The peak bytes of one synchronisation fall by F.

Use (torchft's names; the synchronisation happens inside ``inner.step()``, as a step
post-hook, so the parameters it leaves are the synchronised ones)::

    inner = AdamW(model.parameters(), lr=4e-4)
    outer = SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    with DiLoCo(model, inner, outer, sync_every=H):    # group=None: the world
        for x, y in batches:
            loss_fn(model(x), y).backward()
            inner.step(); inner.zero_grad()

``group`` is the process group (or a 1-D DeviceMesh) of the replicas: None for
the world, or one dimension of a mesh, so that a replica may itself be DDP / TP over
the other dimension. Each replica's inner optimizer keeps its state across rounds,
and so does the outer optimizer (its momentum), one buffer per parameter.
``state_dict()`` / ``load_state_dict()`` save and restore DiLoCo's own part of a
checkpoint (theta_global, the outer optimizer, the inner step count), beside the model
and the inner optimizer, so that a resumed run takes the uninterrupted run's steps.

``shard_group``: for a replica that is DDP inside (its ranks hold the same parameters),
the process group (or 1-D DeviceMesh) of this rank's replica. Rank j of the L ranks then
all-reduces only slice j of each outer gradient across the replicas and the replica
all-gathers the slices (shard.py): 1/L of the bytes on the slow link.

``manager``: a fault-tolerance Manager (parallel/fault_tolerance/) whose replicas are
DiLoCo's; each outer step is then one step of its quorum, and a replica that dies
between two syncs only drops its outer gradient (over_quorum.py).

A step that a GradScaler skips (an inf / NaN gradient, found by each replica alone)
counts as an inner step too (``Optimizer.register_step_skipped_hook``): every replica
synchronises after the same iterations.

A frozen parameter (``requires_grad=False`` at construction) is in no outer all-reduce
and no outer step: it stays as it was, whatever the outer optimizer's weight decay.

Invariant: right after a fragment's synchronisation with alpha = 0 its parameters
are bitwise equal on every replica (the all-reduce leaves the same bits everywhere,
and the outer step is the same arithmetic on the same inputs). Demo:
demos/25_diloco.py; docs: docs/diloco.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import minidist.distributed as dist
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.distributed.device_mesh import DeviceMesh
from minidist.nn import Module
from minidist.parallel.diloco import outer_grad, over_quorum
from minidist.parallel.diloco.fragments import check_optimizers, trained_fragment_params
from minidist.parallel.diloco.schedule import check_schedule, fragment_starting_at
from minidist.parallel.diloco.shard import replica_slices
from minidist import backend
from minidist.backend import xp
from minidist.trace import recorder as trace


@dataclass
class Fragment:
    """A part of the model that synchronises as one (the whole model in plain DiLoCo)."""
    params: list                                 # the model's Parameters, in model order
    global_params: list                          # theta_global, one array per parameter
    pending: Any = None                          # the all-reduce in flight (a Work), or None
    wire: Any = None                             # what travels: (sum numel,) float, or codes
                                                 # (this rank's slice with a shard_group)
    gathered: Any = None                         # (N, W) every replica's codes (quantised)
    merge_at: int = -1                           # the inner step after which it is merged
    started: float = 0.0                         # when it started (trace clock)
    syncs: int = 0                               # synchronisations completed
    history: list = field(default_factory=list)  # (start step, merge step) of each


class DiLoCo:
    """DiLoCo / Streaming DiLoCo around an inner and an outer optimizer (module docstring).

    ``fragments``: None (one fragment, the whole model) or a list whose items are a
    Module or a list of Modules; every parameter of ``model`` must be in exactly one.
    """

    def __init__(self, model: Module, inner_optimizer: Any, outer_optimizer: Any,
                 sync_every: int, group: Any = None,
                 fragments: Sequence[Any] | None = None, fragment_sync_delay: int = 0,
                 fragment_update_alpha: float = 0.0, outer_grad_format: Any = None,
                 shard_group: Any = None, manager: Any = None):
        if manager is not None:
            over_quorum.check_manager(manager, group, shard_group, outer_grad_format,
                                      fragment_sync_delay)
        groups = trained_fragment_params(model, fragments)
        self.frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
        check_schedule(sync_every, len(groups), fragment_sync_delay, fragment_update_alpha)
        check_optimizers(model, inner_optimizer, outer_optimizer)
        self.model = model
        self.inner, self.outer = inner_optimizer, outer_optimizer
        self.sync_every = sync_every
        self.fragment_sync_delay = fragment_sync_delay
        self.fragment_update_alpha = float(fragment_update_alpha)
        self.format = outer_grad.outer_grad_format(outer_grad_format)   # None: full precision
        self.group = _process_group(group)
        self.local_step = 0                      # inner steps taken (t, from 1 after the first)
        self._handles: list = []                 # the inner optimizer's hooks, while entered
        self.manager = manager                   # None: no fault tolerance (over_quorum.py)
        self.healed = False                      # the model was received from a peer since
                                                 # the last sync: none of its steps are its own
        if manager is not None:                  # the manager's first quorum syncs instead
            self.slices = None
            self.fragments = [Fragment(ps, [p.data.copy() for p in ps]) for ps in groups]
            manager.register_state_dict_fn("diloco", self._load_ft_state, self._ft_state)
            manager.start_quorum()
            if self.local_step:    # healed from a member already in a sync: join it
                over_quorum.sync_over_quorum(self, 0)
            self.healed = False    # (the first quorum's init_sync: the round not begun)
            return
        self.slices = replica_slices(_process_group(shard_group), self.group,
                                     list(model.named_parameters()))   # None: whole
        # Every replica starts from the same theta_global: the group's first rank's
        # parameters (as DDP broadcasts rank 0's at wrap); the ranks of a replica with
        # a shard_group from its first rank's, as they hold the same theta.
        for g in ([] if self.slices is None else [self.slices.group]) + [self.group]:
            for p in model.parameters():
                dist.broadcast(p.data, src=_global_rank(g, 0), group=g)
        self.fragments = [Fragment(ps, [p.data.copy() for p in ps]) for ps in groups]

    # -- the context: torchft registers the hook on enter -----------------------
    def __enter__(self) -> "DiLoCo":
        # A step GradScaler skips (inf / NaN) is an inner step too: the replicas skip
        # on their own, and must still synchronise at the same iterations.
        self._handles = [self.inner.register_step_post_hook(self._after_inner_step),
                         self.inner.register_step_skipped_hook(self._after_inner_step)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        # A synchronisation still in flight completes on the wire (so no collective is
        # left half done) but is not merged: the parameters stay the local ones.
        for frag in self.fragments:
            if frag.pending is not None:
                frag.pending.wait()
                frag.pending = None

    # -- what runs after each inner step ------------------------------------------
    def _after_inner_step(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        self.local_step += 1
        t = self.local_step
        f = fragment_starting_at(t, self.sync_every, len(self.fragments))
        if f is not None:
            self._check_frozen()
        if f is not None and not self.fragments[f].params:
            f = None                             # a wholly frozen fragment: nothing to send
        if f is not None and self.manager is not None:
            over_quorum.sync_over_quorum(self, f)
        elif f is not None:
            self.start_sync(f)
        for frag in self.fragments:
            if frag.pending is not None and frag.merge_at == t:
                self.finish_sync(frag)

    def start_sync(self, f: int) -> None:
        """Start fragment f's all-reduce of Delta = theta_global - theta_local, or the
        all-gather of its codes in ``outer_grad_format`` (outer_grad.py)."""
        frag = self.fragments[f]
        deltas = [g - p.data for g, p in zip(frag.global_params, frag.params)]
        frag.started = trace.active.now() if trace.active is not None else 0.0
        frag.merge_at = self.local_step + self.fragment_sync_delay
        frag.history.append((self.local_step, frag.merge_at))
        if self.format is None:
            frag.wire = xp.concatenate([d.reshape(-1) for d in deltas])  # (sum numel,)
            if self.slices is not None:
                frag.wire = self.slices.take(frag.wire)                    # (c,)
            frag.pending = dist.all_reduce(frag.wire, op=ReduceOp.AVG, group=self.group,
                                           async_op=True)
            return
        frag.wire = outer_grad.encode_outer_gradients(deltas, self.format,
                                                      *self._bounds(frag))  # (W,) uint8
        frag.gathered = xp.empty((dist.get_world_size(self.group), frag.wire.size),
                                 dtype=frag.wire.dtype)                          # (N, W)
        frag.pending = dist.all_gather_into_tensor(frag.gathered, frag.wire, group=self.group,
                                                   async_op=True)

    def finish_sync(self, frag: Fragment) -> None:
        """Wait for the mean, run the outer step from theta_global, merge with alpha."""
        frag.pending.wait()
        frag.pending = None
        self.outer_step(frag, self._mean(frag))

    def outer_step(self, frag: Fragment, mean: Any) -> None:
        """theta_global <- OuterOpt(theta_global, mean), then the merge with alpha.
        ``mean``: (sum numel,), the mean outer gradient of the fragment's parameters."""
        local = [p.data.copy() for p in frag.params]
        inner_grads = {id(p): p.grad for p in self.model.parameters()}
        for p in self.model.parameters():          # the outer step touches this fragment only
            p.grad = None
        offset = 0
        for p, g in zip(frag.params, frag.global_params):
            p.data[...] = g                          # back to theta_global ...
            flat = mean[offset:offset + g.size]          # ... with the mean Delta as .grad
            p.grad = flat.reshape(g.shape).astype(g.dtype, copy=False)
            offset += g.size
        self.outer.step()                            # theta_global <- OuterOpt(...)
        alpha = self.fragment_update_alpha
        for p, g, mine in zip(frag.params, frag.global_params, local):
            g[...] = p.data                          # keep the new theta_global
            if alpha != 0.0:                         # alpha * local + (1 - alpha) * global
                p.data[...] = alpha * mine + (1.0 - alpha) * p.data
        for p in self.model.parameters():
            p.grad = inner_grads[id(p)]
        frag.syncs += 1
        if trace.active is not None:                 # the span the inner steps overlap
            trace.active.span(f"DiLoCo fragment {self.fragments.index(frag)} sync", "diloco",
                              frag.started, trace.active.now(),
                              {"bytes": int(frag.wire.nbytes), "merge_step": frag.merge_at})


    # -- saving and resuming -------------------------------------------------------
    def state_dict(self) -> dict:
        """DiLoCo's own state, beside the model's and the inner optimizer's: the inner
        step count t, theta_global of each fragment and the outer optimizer's state (its
        momentum): ``{'local_step': t, 'global': [[array, ...] per fragment], 'outer':
        outer.state_dict()}`` (live arrays). Each replica saves its own (its model is
        its own between syncs). Refused while a fragment's outer gradient is on the wire
        (``fragment_sync_delay`` > 0): that cannot be saved."""
        busy = [f for f, frag in enumerate(self.fragments) if frag.pending is not None]
        if busy:
            raise RuntimeError(
                f"fragment(s) {busy} are synchronising (their outer gradient is in flight "
                f"until inner step {self.fragments[busy[0]].merge_at}; this is step "
                f"{self.local_step}): save at a step where no synchronisation is in flight")
        return {"local_step": self.local_step,
                "global": [list(frag.global_params) for frag in self.fragments],
                "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` saved (arrays copied). Load it after building
        DiLoCo: its construction broadcasts the first replica's parameters, which would
        overwrite a model loaded before."""
        saved = state["global"]
        shapes = [[tuple(g.shape) for g in frag.global_params] for frag in self.fragments]
        if [[tuple(a.shape) for a in arrays] for arrays in saved] != shapes:
            raise ValueError("DiLoCo's state dict holds theta_global of other fragments or "
                             "shapes than this DiLoCo's: build it with the same model, "
                             "fragments and frozen parameters")
        self.outer.load_state_dict(state["outer"])
        self.local_step = int(state["local_step"])
        for frag, arrays in zip(self.fragments, saved):
            for g, a in zip(frag.global_params, arrays):
                g[...] = backend.from_host(a)

    def _ft_state(self) -> dict:
        return self.state_dict()

    def _load_ft_state(self, state: dict) -> None:
        self.load_state_dict(state)
        self.healed = True

    def _check_frozen(self) -> None:
        """Refuse a parameter frozen or unfrozen since construction: its outer gradient
        would be left out, or would come to an outer step that does not expect it."""
        now = [n for n, p in self.model.named_parameters() if not p.requires_grad]
        if now != self.frozen:
            changed = sorted(set(now) ^ set(self.frozen))
            raise RuntimeError(f"parameters {changed} changed requires_grad after DiLoCo "
                               "was built; DiLoCo leaves the parameters frozen at its "
                               "construction out of the outer step: build DiLoCo again "
                               "after freezing or unfreezing")

    def _bounds(self, frag: Fragment) -> tuple[int, int | None]:
        """[lo, hi) of the fragment's values this rank sends (all without a shard_group)."""
        if self.slices is None:
            return 0, None
        return self.slices.bounds(sum(g.size for g in frag.global_params))

    def _mean(self, frag: Fragment) -> Any:
        """The mean outer gradient of the whole fragment, (sum numel,), once it arrived."""
        sizes = [g.size for g in frag.global_params]
        mean = frag.wire if self.format is None else outer_grad.mean_of_encoded(
            frag.gathered, sizes, self.format, frag.global_params[0].dtype,
            *self._bounds(frag))
        if self.slices is not None:                  # the replica's slices, end to end
            mean = self.slices.gather(mean, sum(sizes))
        return mean


def _process_group(group: Any) -> Any:
    """The ProcessGroup of ``group`` (a 1-D DeviceMesh or a ProcessGroup; None: None)."""
    return group.get_group() if isinstance(group, DeviceMesh) else group


def _global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (None: the world)."""
    if group is None:
        return group_rank
    return group.ranks[group_rank]
