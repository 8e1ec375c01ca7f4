"""ZeRO stages 1 and 2: shard the optimizer state, then the gradients too.

Plain data parallelism keeps on each of N ranks the weights, the gradients and
the optimizer state of all P parameters. ZeRO (Rajbhandari et al., 2020) cuts
them into N flat shards (shard.py) so that each rank keeps only its own:

    stage 1  optimizer state sharded    step: reduce_scatter(g) -> my g shard;
                                          update my shard of w with my state;
                                          all_gather(w shards) -> every rank's w
    stage 2  + gradients sharded         each bucket's gradient is reduce-scattered
                                          as soon as backward has produced it, and the
                                          full gradient is freed: a rank keeps g/N
    stage 3  + weights sharded           zero3.py

Bytes per parameter per rank with Adam (mixed: 4 + 12/N and 2 + 14/N; fp32:
8 + 8/N and 4 + 12/N); memory.py has the table, ``memory_report()`` the
measurement. Communication per step equals DDP's all-reduce: a reduce-scatter
plus an all-gather, (N-1)/N * M each.

The optimizer is built by ZeRO on the shard tensors (one flat tensor per
bucket), so ``optimizer.state`` holds only this rank's 1/N: SGD, Adam and AdamW
update element by element, so updating a flat shard is the same arithmetic as
updating the parameters one by one. Clipping uses the norm of the *whole*
gradient: sqrt(all_reduce(sum of squares of my shard)). Gradient accumulation:
call backward several times, then ``step()``; stage 1 accumulates full
gradients locally, stage 2 accumulates its shard. A parameter that got no gradient
is refused at ``step()``, naming it: one process's optimizer would skip it, but a
flat shard is stepped whole, and a zero in its place would still move it.

Over a model whose parameters are already pieces (a tensor-parallel plan over
"tp", ZeRO over "dp": torchtitan's 2-D), each flat group holds one kind of piece
(``buckets_by_kind``) and its shard is registered as a piece of that kind
(autograd/pieces.py): the norm adds the shards' shares over the kind's groups, then
over the ZeRO group, and GradScaler max-combines its inf flag over them too, so every
rank clips by the whole model's norm and skips the same steps
(tests/parallel/zero/test_zero_tp.py):

    ||g||^2 = all_reduce_dp( ||whole-tensor shards||^2
                             + sum over kinds: all_reduce_kind( ||shards of kind||^2 ) )

    zero = Zero2(model, AdamW, lr=1e-3, max_grad_norm=1.0)
    loss = loss_fn(zero(x_mine), y_mine); loss.backward()
    zero.step(); zero.zero_grad()

The demo is demos/05_zero.py.
"""
from __future__ import annotations

import math
from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.distributed._shared_tokens import share_tokens
from minidist.distributed.tensor._piece_norm import refuse_pieces_as_replicas
from minidist.nn.module import Module
from minidist.autograd.pieces import piece_kinds, piece_layout, register_piece
from minidist.optim import SGD, Adam, AdamW, Muon, clip_grads_with_norm_, total_grad_share
from minidist.parallel.data.buckets import DEFAULT_BUCKET_CAP_MB, split_in_buckets
from minidist.parallel.data.naive import broadcast_parameters
from minidist.parallel.zero.muon import FlatShardMuon
from minidist.parallel.zero.shard import FlatLayout
from minidist.optim.optimizer import optimizer_bytes
from minidist.parallel.zero.memory import report
from minidist.precision import quantize

ELEMENTWISE_OPTIMIZERS = (SGD, Adam, AdamW)


def buckets_by_kind(params: list[Tensor], cap_bytes: float) -> list[list[Tensor]]:
    """``split_in_buckets`` within each kind of piece (autograd/pieces.py; the whole
    tensors are one kind), so that a flat group, and so its shard, is one kind."""
    whole, kinds = piece_kinds(params)
    buckets = split_in_buckets(whole, cap_bytes) if whole else []
    for _, pieces in kinds:
        buckets += split_in_buckets(pieces, cap_bytes)
    return buckets


def _kind_key(param: Tensor) -> Any:
    layout = piece_layout(param)
    return None if layout is None else layout.key


class ZeroBase(Module):
    """What every stage shares: flat groups with one shard tensor each, the sharded
    optimizer, whole-model clipping, the step and the accounting."""

    stage = 0

    def __init__(self, module: Module, optimizer_class: type, *, group: Any = None,
                 max_grad_norm: float | None = None, precision: str | None = None,
                 **optimizer_kwargs: Any):
        super().__init__()
        # LAMB subclasses Adam: not it. Muon gathers each matrix's pieces (zero/muon.py)
        if optimizer_class not in ELEMENTWISE_OPTIMIZERS + (Muon,) or \
                (optimizer_class is Muon and self.stage == 3):
            raise TypeError(f"ZeRO shards flat vectors, so it needs an elementwise optimizer "
                            f"(SGD, Adam, AdamW; Muon at stages 1 and 2), got {optimizer_class!r}: "
                            "a trust ratio (LAMB, LARS) takes norms of whole tensors, which "
                            "fully_shard's per-tensor pieces give it")
        refuse_pieces_as_replicas(list(module.named_parameters()), group, type(self).__name__)
        self.module = module
        self.group = group
        share_tokens(module, group, "batch")    # the routers' counts: every replica's batch
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.max_grad_norm = max_grad_norm
        self.precision = precision              # None, or an emulated format: 'fp16', 'bf16'
        self.layouts: list[FlatLayout] = []
        self.shards: list[Tensor] = []          # my shard of each group: the optimizer's params
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._optimizer_class, self._optimizer_kwargs = optimizer_class, optimizer_kwargs

    def _make_optimizer(self) -> None:
        self._mixed = []   # flat groups holding several kinds of piece (a ZeRO-3 unit)
        for layout, shard in zip(self.layouts, self.shards):
            kinds = {_kind_key(p) for p in layout.params}
            if len(kinds) > 1:
                self._mixed += self.pending_parameter_names(layout.params)
            elif kinds != {None}:   # a shard of pieces combines as they do (buckets_by_kind)
                register_piece(shard, piece_layout(layout.params[0]))
        if self._optimizer_class is Muon:
            self.optimizer = FlatShardMuon(self.shards, self.layouts, self.group,
                                           **self._optimizer_kwargs)
        else:
            self.optimizer = self._optimizer_class(self.shards, **self._optimizer_kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _round(self, arr: Any) -> Any:
        """Values as the model's format holds them (identity without mixed precision)."""
        return arr if self.precision is None else quantize(arr, self.precision)

    # -- the step ---------------------------------------------------------------
    def _reduce_gradients(self) -> None:
        """Leave the mean gradient shard in ``shard.grad`` for every group."""
        raise NotImplementedError

    def _gather_parameters(self) -> None:
        """Bring every rank's copy of the weights up to date from the shards."""
        raise NotImplementedError

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the norm of the whole gradient; each rank sees only its shard:
        ||g|| = sqrt( sum_r ||g_r||^2 ), one all-reduce of one number (after the
        shards of pieces have added their shares over their own groups)."""
        self._check_one_kind_per_shard("clip the gradients")
        local = backend.from_host([total_grad_share(self.shards)])           # (1,) float64
        dist.all_reduce(local, group=self.group)
        total = math.sqrt(float(backend.to_host(local)[0]))
        clip_grads_with_norm_(self.shards, max_norm, total)
        return total

    def step(self, scaler: Any = None) -> float | None:
        """Reduce gradients, clip (if ``max_grad_norm``), update my shard, gather weights.
        Returns the total gradient norm when clipping, else None.

        ``scaler``: a ``GradScaler`` (fp16 loss scaling). The reduced shard's
        gradients are unscaled before clipping, and the update is skipped if
        any gradient is inf / NaN. Each rank sees only its shard, so the scaler
        must combine that flag over the group, or the ranks would step apart:
        ``GradScaler(found_inf_reduce=found_inf_reduce(group))`` (torch's
        ShardedGradScaler). Call ``scaler.update()`` after the step.
        """
        if scaler is not None and self.world_size > 1 and scaler.found_inf_reduce is None:
            raise ValueError("with sharded gradients every rank must agree on skipping a step: "
                             "build the scaler as GradScaler(found_inf_reduce="
                             "minidist.parallel.found_inf_reduce(group))")
        if scaler is not None:
            self._check_one_kind_per_shard("combine GradScaler's inf flag")
        self._reduce_gradients()
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        norm = None
        if self.max_grad_norm is not None:
            norm = self.clip_grad_norm_(self.max_grad_norm)
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.step(self.optimizer)         # no update if some rank found inf / NaN
        self._gather_parameters()
        return norm

    def _check_one_kind_per_shard(self, what: str) -> None:
        if self._mixed:
            raise ValueError(f"ZeRO-{self.stage} cannot {what}: a unit's flat shard mixes "
                             f"tensor-parallel slices with tensors cut otherwise ({self._mixed}), "
                             "so its shard has no one group to combine over; use ZeRO-1/2, or "
                             "fully_shard over the data-parallel mesh (torchtitan's 2-D)")

    def after_load(self) -> None:
        """After the shards were overwritten (a checkpoint): refresh the weights."""
        self._gather_parameters()

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        for s in self.shards:
            s.grad = None

    # -- accounting ---------------------------------------------------------------
    def _width(self, arr: Any) -> float:
        """Bytes per element of a model weight or gradient (2 for emulated fp16 / bf16)."""
        return 2 if self.precision is not None else arr.itemsize

    def memory_report(self) -> dict:
        """Bytes this rank holds now: weights, gradients and optimizer state (which
        includes the float32 master shard under mixed precision). Call it after
        backward, before zero_grad, to see the gradients."""
        raise NotImplementedError

    def pending_parameter_names(self, params: list[Tensor]) -> list[str]:
        return [self._names.get(id(p), "?") for p in params]


class Zero1(ZeroBase):
    """ZeRO stage 1: optimizer state sharded; full gradients, reduce-scattered in step()."""

    stage = 1

    def __init__(self, module: Module, optimizer_class: type, *, group: Any = None,
                 bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
                 max_grad_norm: float | None = None, precision: str | None = None,
                 **optimizer_kwargs: Any):
        super().__init__(module, optimizer_class, group=group, max_grad_norm=max_grad_norm,
                         precision=precision, **optimizer_kwargs)
        broadcast_parameters(module, group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.flats: list[Any] = []               # the full flat weights of each group
        for ps in buckets_by_kind(params, bucket_cap_mb * 1e6):
            layout = FlatLayout(ps, self.world_size, self.rank)
            flat = layout.flatten([p.data for p in ps])                      # (N*S,)
            if precision is None:
                master = layout.my_shard(flat)       # fp32: the shard is a view, no copy
            else:
                master = layout.my_shard(flat).copy()   # float32 master, kept apart
                flat[...] = self._round(flat)
            for p, view in zip(ps, layout.views(flat)):
                p.data = view                        # the model reads the flat buffer
            self.layouts.append(layout)
            self.flats.append(flat)
            self.shards.append(Tensor(master, requires_grad=True))
        self._make_optimizer()

    def _group_grads(self, layout: FlatLayout) -> Any:
        return layout.flatten([None if p.grad is None else self._round(p.grad)
                               for p in layout.params])                       # (N*S,)

    def _reduce_gradients(self) -> None:
        missing = [q for layout in self.layouts for q in layout.params if q.grad is None]
        if missing:     # a zero in its place would let AdamW move it (momentum, decay)
            raise RuntimeError(f"ZeRO-1: these parameters received no gradient: "
                               f"{self.pending_parameter_names(missing)}. A flat shard is "
                               "stepped whole, so every trainable parameter must take part "
                               "in the loss on every rank (as DDP); freeze one that should "
                               "not train (requires_grad=False)")
        for layout, shard in zip(self.layouts, self.shards):
            mine = backend.xp.empty(layout.shard_size, dtype=layout.dtype)     # (S,)
            dist.reduce_scatter_tensor(mine, self._group_grads(layout), group=self.group)
            mine /= self.world_size                                            # mean
            shard.grad = mine

    def _gather_parameters(self) -> None:
        for layout, flat, shard in zip(self.layouts, self.flats, self.shards):
            own = layout.my_shard(flat)
            if self.precision is not None:
                own[...] = self._round(shard.data)
            dist.all_gather_into_tensor(flat, own, group=self.group)

    def memory_report(self) -> dict:
        params = sum(f.size * self._width(f) for f in self.flats)
        grads = sum(p.grad.size * self._width(p.grad)
                    for layout in self.layouts for p in layout.params if p.grad is not None)
        model = self.shards if self.precision is None else []   # fp32: shards view weights
        return report(params, grads, optimizer_bytes(self.optimizer, model))


class Zero2(Zero1):
    """ZeRO stage 2: gradients sharded too. Each bucket is reduce-scattered (async,
    overlapping backward) once its gradients are all ready; full gradients are freed."""

    stage = 2

    def __init__(self, module: Module, optimizer_class: type, **kwargs: Any):
        super().__init__(module, optimizer_class, **kwargs)
        self._group_of: dict[int, int] = {}
        for i, layout in enumerate(self.layouts):
            for p in layout.params:
                self._group_of[id(p)] = i
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self._ready: list[set[int]] = [set() for _ in self.layouts]
        self._inflight: list[tuple[int, Any, Any]] = []   # (group, work, shard buffer)

    def _grad_ready(self, p: Tensor) -> None:
        i = self._group_of[id(p)]
        layout = self.layouts[i]
        self._ready[i].add(id(p))
        if len(self._ready[i]) < len(layout.params):
            return
        grads = self._group_grads(layout)                                      # (N*S,)
        for q in layout.params:
            q.grad = None                      # stage 2 keeps only the shard
        mine = backend.xp.empty(layout.shard_size, dtype=layout.dtype)         # (S,)
        work = dist.reduce_scatter_tensor(mine, grads, group=self.group, async_op=True)
        self._inflight.append((i, work, mine))
        self._ready[i] = set()
        if len(self._inflight) == len(self.layouts):
            self._finish_backward()

    def _finish_backward(self) -> None:
        for i, work, mine in self._inflight:
            work.wait()
            mine /= self.world_size
            shard = self.shards[i]
            if shard.grad is None:
                shard.grad = mine
            else:
                shard.grad += mine             # gradient accumulation, on the shard
        self._inflight = []

    def _reduce_gradients(self) -> None:
        missing = [q for i, layout in enumerate(self.layouts) if self._ready[i]
                   for q in layout.params if id(q) not in self._ready[i]]
        if missing or self._inflight:
            names = self.pending_parameter_names(missing)
            raise RuntimeError(f"ZeRO-2: the last backward did not finish reducing gradients; "
                               f"these parameters received no gradient: {names}")

    def memory_report(self) -> dict:
        params = sum(f.size * self._width(f) for f in self.flats)
        grads = sum(s.grad.size * self._width(s.grad) for s in self.shards
                    if s.grad is not None)
        model = self.shards if self.precision is None else []
        return report(params, grads, optimizer_bytes(self.optimizer, model))
