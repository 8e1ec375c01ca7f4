"""ZeRO stage 3: weights sharded too; each layer is gathered just in time.

Every *unit* (by default each module that owns parameters directly: a Linear, a
LayerNorm, an Embedding) keeps only its flat shard of S = ceil(P_unit/N)
elements; its parameters' ``.data`` are empty between uses. Around each unit:

    forward:   all_gather(shards) -> full weights; y = unit(x); free the weights
    backward:  all_gather(shards) again; recompute y = unit(x) with the graph on;
               backpropagate dL/dy; reduce_scatter(full grads) -> my grad shard;
               free the weights and the full gradients

Bytes per parameter per rank with Adam: 16/N (either precision), plus one or two
units' full weights while they are in use. Communication per step is 1.5x DDP's:
two all-gathers and one reduce-scatter of (N-1)/N * M each.

Why the recompute: autograd ops keep the arrays they saved for backward, so a
gathered weight saved by the unit's forward graph could not be freed until
backward. PyTorch's FSDP frees the storage under the saved tensor and refills it
in place; NumPy cannot resize memory under its views. So the unit's forward runs
without a graph (keeping only its input), and backward rebuilds the graph of
that one unit from the regathered weights. The values are the same bits: the
same operations on the same inputs (the same random draws, replayed, and the
same precision policy: the autocast, FP8 or block-scaling region the forward ran
in has closed by backward, so the recompute re-enters it, autograd/recompute.py;
an FP8 recipe's sites are numbered and its amaxes recorded as by the one forward).

``prefetch=True`` starts the all-gather of the next unit (in the order the first
forward ran them; the previous one in backward) asynchronously, so it overlaps
the current unit's compute. ``gather_timeline`` says, for the last step, when
each gather ran and how much of it hid behind compute (gather_timeline.py).

Tied parameters (GPT's ``wte.weight``, also ``lm_head.weight``): a parameter that
two units hold belongs to neither. The shared parameters form one more flat group,
kept like the root unit of FSDP: gathered once when the wrapper's forward starts,
held through forward and backward (both uses see the same full array, and their
gradients add up in it, in the graph or in a unit's rebuilt one), and
reduce-scattered once in ``step()``, before the update; then freed until the next
forward. A unit left with no parameter of its own is not a unit: it runs on the
shared weights in the ordinary graph.

The unit's shard is a leaf tensor that is an *input* of the unit's autograd node,
so backward delivers the reduce-scattered gradient to ``shard.grad`` through the
ordinary engine (accumulating over micro-batches) and the optimizer, built on the
shards, never sees a full parameter. A unit's forward takes one input.

A unit that ran must use every parameter it holds: its shard is stepped whole, so a
zero in place of a missing gradient would let AdamW move a parameter one process
leaves alone (momentum, weight decay). Such a parameter is refused by name, as
fully_shard and ZeRO-1 refuse it; a unit that does not run in a step gets no
gradient and is skipped, as one process skips its parameters.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import minidist.distributed as dist
from minidist import backend
from minidist.autograd.engine import backward as run_backward
from minidist.autograd.function import Function
from minidist.autograd.grad_mode import enable_grad, no_grad
from minidist.autograd.recompute import capture_forward_context
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn.module import Module
from minidist.parallel.data.naive import broadcast_parameters
from minidist.parallel.zero.gather_timeline import GatherTimeline
from minidist.parallel.zero.shard import FlatLayout
from minidist.parallel.zero.zero12 import ZeroBase
from minidist.optim.optimizer import optimizer_bytes
from minidist.parallel.zero.memory import report
from minidist.trace import recorder as trace


class Unit:
    """One module whose parameters are gathered and freed together."""

    def __init__(self, index: int, module: Module, layout: FlatLayout, shard: Tensor,
                 forward: Callable):
        self.index, self.module, self.layout, self.shard = index, module, layout, shard
        self.forward = forward                  # the module's own forward
        self.prefetched: Any = None             # (work, flat) of an async gather
        self.event: dict | None = None          # its row of the gather timeline now

    def empty(self) -> None:
        for p in self.layout.params:
            p.data = xp.empty(0, dtype=self.layout.dtype)   # freed: nothing held
        if self.event is not None:
            self.event["compute_end"], self.event = time.perf_counter(), None


class _GatheredUnit(Function):
    """y = unit(x) with the unit's weights present only inside forward and backward."""

    @staticmethod
    def forward(ctx, x, shard, engine=None, unit=None):
        ctx.engine, ctx.unit = engine, unit
        ctx.save_for_backward(x)
        ctx.rng_state = backend.default_generator().get_state()
        ctx.context = capture_forward_context()         # the autocast / FP8 policy now
        engine._materialize(unit, direction=+1)
        try:
            with no_grad():
                out = unit.forward(Tensor(x))
        finally:
            unit.empty()
        return out.data

    @staticmethod
    def backward(ctx, grad):
        engine, unit = ctx.engine, ctx.unit
        (x,) = ctx.saved
        engine._materialize(unit, direction=-1)
        gen = backend.default_generator()
        state_now = gen.get_state()
        gen.set_state(ctx.rng_state)                    # replay the forward's draws
        x_in = Tensor(x, requires_grad=ctx.needs_input_grad[0])
        try:
            for p in unit.layout.params:
                p.grad = None
            with ctx.context, enable_grad():            # as the forward ran
                out = unit.forward(x_in)
            gen.set_state(state_now)
            run_backward(out, grad)
            grads = engine._round_grads(unit)
        finally:
            for p in unit.layout.params:
                p.grad = None
            unit.empty()
        full = unit.layout.flatten(grads)                                        # (N*S,)
        mine = xp.empty(unit.layout.shard_size, dtype=unit.layout.dtype)         # (S,)
        dist.reduce_scatter_tensor(mine, full, group=engine.group)
        mine /= engine.world_size                                                # mean
        return (x_in.grad if ctx.needs_input_grad[0] else None), mine


class Zero3(ZeroBase):
    """ZeRO stage 3 (see the module docstring). ``units``: the modules to gather as
    one piece (default: every module that owns parameters directly); they must not
    be nested and must cover every parameter. A parameter held by two units
    (tied weights) is shared: gathered once per forward, reduce-scattered once per
    step. Call the wrapper, ``zero(x)``, not the module: it gathers the shared ones."""

    stage = 3

    def __init__(self, module: Module, optimizer_class: type, *, group: Any = None,
                 units: list[Module] | None = None, prefetch: bool = False,
                 max_grad_norm: float | None = None, precision: str | None = None,
                 **optimizer_kwargs: Any):
        super().__init__(module, optimizer_class, group=group, max_grad_norm=max_grad_norm,
                         precision=precision, **optimizer_kwargs)
        broadcast_parameters(module, group)
        if units is None:
            units = [m for m in module.modules() if m._parameters
                     and any(p is not None for p in m._parameters.values())]
        self.prefetch = prefetch
        self._gathers = GatherTimeline()
        self.gather_timeline: list[dict] = []   # the last step's (gather_timeline.py)
        self.units: list[Unit] = []
        self._order: list[Unit] = []            # units in the order forward ran them
        held = [[p for p in m.parameters() if p.requires_grad] for m in units]
        holders: dict[int, int] = {}
        for ps in held:
            for p in {id(p): p for p in ps}.values():
                holders[id(p)] = holders.get(id(p), 0) + 1
        shared = list({id(p): p for ps in held for p in ps if holders[id(p)] > 1}.values())
        for m, ps in zip(units, held):
            own = [p for p in ps if holders[id(p)] == 1]
            if own:
                unit = self._new_unit(len(self.units), m, own, m.forward)
                object.__setattr__(m, "forward", self._wrapped(unit))
                self.units.append(unit)
        self.shared = self._new_unit(-1, module, shared, None) if shared else None
        self._shared_present = False
        left = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in holders]
        if left:
            raise ValueError(f"parameters outside every unit: {left}")
        self._make_optimizer()

    def _new_unit(self, index: int, module: Module, params: list, forward: Any) -> Unit:
        """A flat group of ``params``: keep my shard of it, free the full weights."""
        layout = FlatLayout(params, self.world_size, self.rank)
        master = layout.my_shard(layout.flatten([p.data for p in params])).copy()   # (S,)
        unit = Unit(index, module, layout, Tensor(master, requires_grad=True), forward)
        unit.empty()
        self.layouts.append(layout)
        self.shards.append(unit.shard)
        return unit

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.shared is not None and not self._shared_present:
            _, flat = self._start_gather(self.shared, async_op=False)
            for p, view in zip(self.shared.layout.params, self.shared.layout.views(flat)):
                p.data = view
            self._shared_present = True
        return self.module(*args, **kwargs)

    def _reduce_shared(self) -> None:
        """The shared parameters' gradients, summed over both uses, to my shard: once."""
        shared = self.shared
        if shared is None or not self._shared_present:
            return
        full = shared.layout.flatten(self._round_grads(shared))                  # (N*S,)
        mine = xp.empty(shared.layout.shard_size, dtype=shared.layout.dtype)     # (S,)
        dist.reduce_scatter_tensor(mine, full, group=self.group)
        mine /= self.world_size
        shared.shard.grad = mine if shared.shard.grad is None else shared.shard.grad + mine
        for p in shared.layout.params:
            p.grad = None
        shared.empty()
        self._shared_present = False

    def _wrapped(self, unit: Unit) -> Callable:
        def forward(x: Any) -> Tensor:
            return _GatheredUnit.apply(x, unit.shard, engine=self, unit=unit)
        return forward

    # -- gathering ---------------------------------------------------------------
    def _start_gather(self, unit: Unit, async_op: bool) -> tuple[Any, Any]:
        flat = xp.empty(unit.layout.padded, dtype=unit.layout.dtype)             # (N*S,)
        own = self._round(unit.shard.data)
        work = dist.all_gather_into_tensor(flat, own, group=self.group, async_op=async_op)
        return work, flat

    def _materialize(self, unit: Unit, direction: int) -> None:
        """Full weights of ``unit`` into its parameters; prefetch the next unit."""
        phase = "forward" if direction > 0 else "backward"
        start = time.perf_counter()
        if unit.prefetched is not None:
            work, flat = unit.prefetched
            unit.prefetched = None
            unit.event = self._gathers.needed(unit.index, phase, work,
                                              getattr(work, "issued_at", None))
            work.wait()
        else:
            unit.event = self._gathers.needed(unit.index, phase, None, None)
            _, flat = self._start_gather(unit, async_op=False)
            unit.event["end"] = time.perf_counter()
        for p, view in zip(unit.layout.params, unit.layout.views(flat)):
            p.data = view
        if trace.active is not None:   # the wait for this unit's weights (trace/)
            trace.active.span(f"ZeRO-3 gather unit {unit.index} ({phase})", "zero", start,
                              time.perf_counter(), dict(prefetched=unit.event["prefetched"]))
        if direction > 0 and unit not in self._order:
            self._order.append(unit)
        if self.prefetch and unit in self._order:
            k = self._order.index(unit) + direction
            if 0 <= k < len(self._order) and self._order[k].prefetched is None:
                nxt = self._order[k]
                nxt.prefetched = self._start_gather(nxt, async_op=True)

    def _drop_prefetched(self) -> None:
        """Gathers started for units that did not run (stale once the shards change)."""
        for unit in self.units:
            if unit.prefetched is not None:
                unit.prefetched[0].wait()
                unit.prefetched = None

    def _round_grads(self, unit: Unit) -> list[Any]:
        """The unit's gradients, to reduce-scatter; refuses a parameter without one
        (module docstring)."""
        missing = [p for p in unit.layout.params if p.grad is None]
        if missing:     # a zero in its place would let AdamW move it (momentum, decay)
            raise RuntimeError(f"ZeRO-3: these parameters of a unit that ran received no "
                               f"gradient: {self.pending_parameter_names(missing)}. A unit's "
                               "shard is stepped whole; give a module that may sit out a "
                               "step its own unit (units=..., the default: every module "
                               "that owns parameters; a unit that does not run gets no "
                               "gradient), or freeze what should not train "
                               "(requires_grad=False)")
        return [self._round(p.grad) for p in unit.layout.params]

    # -- the step: shards already hold their gradients ----------------------------
    def _reduce_gradients(self) -> None:
        self._drop_prefetched()
        self._reduce_shared()
        self.gather_timeline = self._gathers.finish()

    def _gather_parameters(self) -> None:
        pass                                      # gathered on demand, unit by unit

    def after_load(self) -> None:
        self._drop_prefetched()
        if self.shared is not None:      # regathered from the loaded shard at next forward
            self.shared.empty()
            self._shared_present = False

    def full_state_dict(self) -> dict:
        """Every parameter in full (gathers each unit; for saving or comparing)."""
        out = {}
        for unit in self.units + ([self.shared] if self.shared is not None else []):
            _, flat = self._start_gather(unit, async_op=False)
            for p, view in zip(unit.layout.params, unit.layout.views(flat)):
                out[self._names.get(id(p), "?")] = view.copy()
        return out

    def memory_report(self) -> dict:
        params = sum(s.data.size * self._width(s.data) for s in self.shards)
        grads = sum(s.grad.size * self._width(s.grad) for s in self.shards
                    if s.grad is not None)
        model = self.shards if self.precision is None else []
        opt = optimizer_bytes(self.optimizer, model)
        if self.precision is not None:
            # the shards are the float32 master; the low-precision copy is never kept
            params = sum(s.data.size * 2 for s in self.shards)
            opt = optimizer_bytes(self.optimizer, self.shards) + sum(s.data.nbytes
                                                                   for s in self.shards)
        return report(params, grads, opt)
