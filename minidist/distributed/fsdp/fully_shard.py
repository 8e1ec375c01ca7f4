"""fully_shard (FSDP2): every parameter a Shard(0) DTensor, gathered around its use.

    for block in model.blocks:
        fully_shard(block, mesh=mesh)           # one unit per block
    fully_shard(model, mesh=mesh)               # the root: what is left (embeddings, ln_f)

Each parameter of a unit keeps only its dim-0 piece on each rank (torch.chunk's
pieces: ``ceil(rows / N)`` rows, the last ranks fewer or none). Around the
unit's forward:

    forward:    Shard(0) -> Replicate       all-gather the unit's parameters
    backward:   Partial(avg) -> Shard(0)    reduce-scatter their gradients (the mean over
                                            ranks of each rank's gradient of its micro-batch)

Each is the change of placement of redistribute (tensor/_collectives.py), done
for all the unit's parameters in one collective: their pieces, each padded to
its ``ceil(rows / N)`` rows, lie side by side in one buffer (FSDP2's copy-in and
copy-out), so a unit costs one all-gather and one reduce-scatter, not one per
parameter.

FSDP2's lifecycle, one named step each (a breakpoint per idea):

    shard parameters      shard_parameters          at fully_shard: keep this rank's pieces
    gather for forward    FSDPState.gather("forward")   the unit's forward starts
    reshard               FSDPState.reshard         the forward is done: the pieces again
    pre-backward          FSDPState.pre_backward    a kept unit's (the root's) output gets
                                                its first gradient: issue the gathers of
                                                the units before it (pre_backward.py)
    gather for backward   FSDPState.gather("backward")  a resharded unit's backward starts
    reduce gradients      FSDPState.reduce_or_keep  its backward is done: issue the
                                                reduce-scatter, left in flight while the
                                                units before it compute; the pieces land
                                                in .grad when backward ends (post_backward.py)

``reshard_after_forward=True`` frees the gathered parameters once the unit's
forward is done and gathers them again for its backward, which recomputes the
unit's forward from its saved input (as ZeRO-3 here does: NumPy cannot free the
memory under an array that the graph saved): per step two all-gathers and one
reduce-scatter of (N-1)/N * M each, and only a unit's full weights at a time.
``False`` keeps them from forward to backward: one all-gather, more memory. The
root (a module holding units) always keeps its own until backward, as torch; so
does a unit that holds an MoE (its balancing loss leaves the unit beside the
output, and a graph-free forward would cut that loss's gradient). A unit's
forward may take more arguments than its input (a Llama layer's positions and
documents) as long as only the input is a Tensor.

Bytes per rank for parameters, gradients and Adam's two moments in float32:
``16 P / N`` (the dim-0 pieces: at most N-1 rows of padding per parameter over
ZeRO-3's flat shards), the same formula as ZeRO-3. The difference from ZeRO-3
(parallel/zero/zero3.py, one flat buffer per unit cut into N equal parts): each
parameter is cut on its own, so a rank's piece of a weight is a block of whole
rows that a DTensor can describe, and the optimizer's state, the checkpoint
and the gradient clipping work parameter by parameter (FSDP2's reason for the
change): ``optim.clip_grad_norm_(model.parameters(), ...)`` counts each piece with
the other ranks' (distributed/tensor/_piece_norm.py).

``reshard_after_forward=k`` (an int dividing N) keeps, from forward to backward, each
parameter cut for a group of k ranks (a node), so backward's all-gather runs within that
group (state.py). The next unit's all-gather is issued before the current unit computes
(FSDP2's prefetch, state.py); ``set_modules_to_*_prefetch`` choose others. Ties: ties.py.

On a 2-D mesh (HSDP, hsdp.py) the parameters are placed (Replicate(), Shard(0)): the
gathers and the reduce-scatter run over dim 1 (the N above is its size), and each
gradient piece is then all-reduced (averaged) over dim 0, the replicas.

``MixedPrecisionPolicy(param_dtype=...)`` casts the gathered parameters (the
compute copy; the sharded float master stays); ``reduce_dtype`` casts the
gradient for the reduce-scatter and back; "bfloat16", "float16" and the other
emulated formats round through minidist.precision, the reduce-scatter rounding each
partial sum as bf16 hardware does (reduce_format.py). ``module.set_requires_gradient_sync(False)``
accumulates whole gradients without communication (gradient accumulation: N - 1 of N
micro-batches), the next synced backward reduce-scatters their sum, once.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist import backend
from minidist.autograd.engine import backward as run_backward
from minidist.autograd.function import Function
from minidist.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from minidist.autograd.recompute import capture_forward_context, is_recomputing
from minidist.autograd.tensor import Tensor
from minidist.distributed._shared_tokens import share_tokens
from minidist.distributed.fsdp.hsdp import data_parallel_mesh
from minidist.distributed.fsdp.names import qualify_names
from minidist.distributed.fsdp.pre_backward import with_pre_backward
from minidist.distributed.fsdp.state import FSDPParam, FSDPState, MixedPrecisionPolicy
from minidist.distributed.fsdp.ties import refuse_split_ties
from minidist.distributed.tensor._api import DTensor, distribute_tensor
from minidist.distributed.tensor._collectives import backward_phase
from minidist.distributed.tensor._piece_norm import note_piece, refuse_pieces_as_replicas
from minidist.distributed.tensor._redistribute import GradPlacements
from minidist.nn.module import Module, Parameter, persistent_buffers
from minidist.nn.moe import routes_tokens


def _managed_parameters(module: Module, ignored: set[int] = frozenset()
                        ) -> dict[int, tuple[Parameter, list]]:
    """Parameters of ``module``'s subtree that no inner fully_shard unit holds and that
    are not ``ignored`` (ids)."""
    found: dict[int, tuple[Parameter, list]] = {}

    def walk(m: Module) -> None:
        for name, p in m._parameters.items():
            if p is not None and id(p) not in ignored:
                found.setdefault(id(p), (p, []))[1].append((m, name))
        for child in m._modules.values():
            if "_fsdp_state" not in child.__dict__:
                walk(child)
    walk(module)
    return found


class _ShardedUnit(Function):
    """y = unit(x) with the unit's parameters gathered inside forward and again inside
    backward (reshard_after_forward=True); the gradients leave by a reduce-scatter left in
    flight, their pieces written into the shards' .grad when the backward is done
    (post_backward.py), not returned to the engine."""

    @staticmethod
    def forward(ctx, x, *shards, state=None, inner=None):
        ctx.state, ctx.inner = state, inner
        ctx.save_for_backward(x)
        ctx.rng_state = backend.default_generator().get_state()
        ctx.context = capture_forward_context()   # the autocast / FP8 policy now active
        if is_grad_enabled():                     # a backward will gather it again
            state.awaits_backward += 1
        state.put([Tensor(f) for f in state.gather("forward", keep=True)])
        try:
            with no_grad():
                out = inner(Tensor(x))
        finally:
            state.reshard()
        return out.data

    @staticmethod
    def backward(ctx, grad):
        state, inner = ctx.state, ctx.inner
        (x,) = ctx.saved
        gen = backend.default_generator()
        now = gen.get_state()
        gen.set_state(ctx.rng_state)                  # replay the forward's random draws
        x_in = Tensor(x, requires_grad=ctx.needs_input_grad[0])
        with backward_phase():
            full = [Tensor(f, requires_grad=param.shard.requires_grad)
                    for f, param in zip(state.gather("backward"), state.params)]
        state.awaits_backward -= 1
        if not state.awaits_backward:
            state.post_forward = None             # reshard_after_forward=k: freed
        state.put(full)
        try:
            with ctx.context, enable_grad():      # as the forward ran (autograd/recompute.py)
                out = inner(x_in)
            gen.set_state(now)
            run_backward(out, grad)
        finally:
            state.reshard()
        with backward_phase():              # the pieces land in .grad at the backward's end
            state.reduce_or_keep([f.grad for f in full])
        return (x_in.grad if ctx.needs_input_grad[0] else None, *[None] * len(full))


class _GatheredParameters(Function):
    """The unit's parameters whole (one all-gather); backward: their gradients'
    reduce-scatter, left in flight (post_backward.py). For units that keep them from
    forward to backward."""

    @staticmethod
    def forward(ctx, *shards, state=None):
        ctx.state = state
        fulls = state.gather()
        return tuple(fulls) if len(fulls) > 1 else fulls[0]

    @staticmethod
    def backward(ctx, *grads):
        state = ctx.state
        with backward_phase():              # the pieces land in .grad at the backward's end
            state.reduce_or_keep(grads)
        return (None,) * len(grads) if len(grads) > 1 else None


def fully_shard(module: Module, *, mesh: Any = None, reshard_after_forward: bool | int = True,
                mp_policy: MixedPrecisionPolicy | None = None,
                ignored_params: set | None = None) -> Module:
    """Shard ``module``'s parameters (those no inner unit holds) over ``mesh`` (default:
    the world), gathered around its forward and backward: a 1-D mesh places them
    Shard(0); a 2-D mesh (HSDP, hsdp.py) places them (Replicate(), Shard(0)), dim 0 the
    replicas, dim 1 the ranks that shard. ``reshard_after_forward``: True, False, or the
    size of a smaller group (a node) to keep them sharded over from forward to backward
    (an int dividing the number of ranks that shard). ``ignored_params``: parameters left
    whole and alone (torch's name; their gradients are the caller's to reduce: experts
    spread over an expert-parallel group inside the ranks that shard)."""
    dp = data_parallel_mesh(mesh)
    reshard_after_forward = _reshard_setting(reshard_after_forward, dp.shard_group.size)
    mp_policy = mp_policy or MixedPrecisionPolicy()
    mp_policy.check()
    state = FSDPState(dp, reshard_after_forward, mp_policy)
    shard_parameters(module, state, {id(p) for p in ignored_params or ()})
    _join_schedules(module, state)
    object.__setattr__(module, "_fsdp_state", state)
    qualify_names(module)
    _add_methods(module)
    if state.params:
        object.__setattr__(module, "forward", _sharded_forward(module, state))
    return module


def _reshard_setting(reshard_after_forward: bool | int, shard_size: int) -> bool | int:
    """True, False, or the size of a smaller group; torch's two ends of the int range
    (the number of ranks that shard, 1) read as True and False."""
    if not isinstance(reshard_after_forward, (bool, int)):
        raise TypeError("reshard_after_forward must be True, False, or an int (the size of "
                        f"the group to reshard to), not {reshard_after_forward!r}")
    if not isinstance(reshard_after_forward, bool):
        if reshard_after_forward == shard_size:
            return True
        if reshard_after_forward == 1:
            return False
    return reshard_after_forward


def shard_parameters(module: Module, state: FSDPState, ignored: set[int] = frozenset()) -> None:
    """Replace each parameter no inner unit holds (and not ``ignored``) by this rank's
    Shard(0) piece, and record it in ``state.params`` (FSDP2's lifecycle, step 1: shard
    parameters)."""
    mesh = state.mesh
    managed = _managed_parameters(module, ignored)
    names = {id(p): n for n, p in module.named_parameters()}
    refuse_split_ties(module, managed, names)
    for dim in range(mesh.ndim):                # every rank of the mesh holds a batch
        refuse_pieces_as_replicas([(names.get(key, "?"), p) for key, (p, _) in managed.items()],
                                  mesh.get_group(dim), "fully_shard")
        share_tokens(module, mesh.get_group(dim), "batch")   # the routers' counts
    for param, uses in managed.values():
        shape = tuple(param.shape)
        if not shape:
            raise ValueError(f"fully_shard cuts parameters along dim 0; {uses[0][1]} is a scalar")
        piece = distribute_tensor(param.data, mesh, state.placements).to_local().data.copy()
        shard = Parameter(piece, requires_grad=param.requires_grad)   # frozen stays frozen
        note_piece(shard, mesh, state.placements, cut_from=param)  # clip_grad_norm_: the whole
        for owner, name in uses:
            setattr(owner, name, shard)
        state.params.append(FSDPParam(shard, uses, shape, names.get(id(param), "?")))
    dtypes = {s.dtype for s in state.shards()}
    if len(dtypes) > 1:
        raise ValueError("fully_shard gathers a unit's parameters in one buffer: give them one "
                         f"dtype, or shard the modules apart (got {sorted(map(str, dtypes))})")


def _join_schedules(module: Module, state: FSDPState) -> None:
    """The units inside ``module`` share one prefetch schedule with it (it is their root)."""
    for m in module.modules():
        inner_state = m.__dict__.get("_fsdp_state")
        if m is not module and inner_state is not None \
                and inner_state.schedule is not state.schedule:
            state.schedule.join(inner_state.schedule)
            state.is_root = True


def _sharded_forward(module: Module, state: FSDPState) -> Callable[..., Any]:
    """The unit's forward, its parameters gathered around it (steps 2 to 5: gather for
    forward, reshard, gather for backward, reduce gradients, in _ShardedUnit or
    _GatheredParameters)."""
    inner = module.forward
    # an MoE's balancing loss leaves the unit beside its output (the model adds it to
    # the loss): a graph-free forward would cut its gradient, so such a unit is kept
    side_outputs = any(routes_tokens(m) for m in module.modules())

    def forward(*args: Any, **kwargs: Any) -> Any:
        if _recomputes(state, side_outputs, args, kwargs):
            return _ShardedUnit.apply(args[0], *state.shards(), state=state,
                                      inner=lambda x: inner(x, *args[1:], **kwargs))
        gathered = _GatheredParameters.apply(*state.shards(), state=state)  # kept to backward
        state.put(list(gathered) if isinstance(gathered, tuple) else [gathered])
        try:
            out = inner(*args, **kwargs)
        finally:
            state.reshard()
        return with_pre_backward(out, state)
    return forward


def _recomputes(state: FSDPState, side_outputs: bool, args: tuple, kwargs: dict) -> bool:
    """Whether this forward reshards and its backward gathers again to recompute: a unit
    set to reshard, not the root, with no balancing loss beside its output, not already
    inside a recompute (whose graph is used at once), and whose only Tensor argument is its
    input (a Llama layer's positions and documents are not Tensors)."""
    if not state.reshard_after_forward or state.is_root or side_outputs or is_recomputing():
        return False
    rest = (*args[1:], *kwargs.values())
    return bool(args) and isinstance(args[0], Tensor) \
        and not any(isinstance(a, Tensor) for a in rest)


def _fsdp_states(modules: list[Module], who: str) -> list[FSDPState]:
    states = [m.__dict__.get("_fsdp_state") for m in modules]
    if any(s is None for s in states):
        raise ValueError(f"{who} takes modules that fully_shard has wrapped; got "
                         f"{[type(m).__name__ for m, s in zip(modules, states) if s is None]}")
    return states


def _add_methods(module: Module) -> None:
    """torch's FSDPModule methods, on the module fully_shard wrapped."""
    state = module.__dict__["_fsdp_state"]

    def set_requires_gradient_sync(requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """Off: backward keeps whole gradients and skips the reduce-scatter (gradient
        accumulation); the next backward with it on reduce-scatters their sum."""
        units = [m for m in module.modules() if "_fsdp_state" in m.__dict__] if recurse \
            else [module]
        for m in units:
            m.__dict__["_fsdp_state"].requires_gradient_sync = requires_gradient_sync

    def set_modules_to_forward_prefetch(modules: list[Module]) -> None:
        """Once this unit has its parameters in forward, issue these units' all-gathers
        (instead of the next unit's)."""
        state.forward_prefetch = _fsdp_states(modules, "set_modules_to_forward_prefetch")

    def set_modules_to_backward_prefetch(modules: list[Module]) -> None:
        """Once this unit has its parameters in backward, issue these units' all-gathers
        (instead of the previous unit's)."""
        state.backward_prefetch = _fsdp_states(modules, "set_modules_to_backward_prefetch")
    for method in (set_requires_gradient_sync, set_modules_to_forward_prefetch,
                   set_modules_to_backward_prefetch):
        object.__setattr__(module, method.__name__, method)


def sharded_state_dict(module: Module) -> dict[str, Any]:
    """The parameters of a fully_shard module as Shard(0) DTensors, by name (torch's
    ``model.state_dict()`` under FSDP2; ``.full_tensor()`` the whole one), then the
    persistent buffers: plain arrays, whole on every rank (unsharded, as torch's)."""
    out: dict[str, Any] = {}
    for name, p in module.named_parameters():
        owner_name, attr = name.rsplit(".", 1) if "." in name else ("", name)
        owner = dict(module.named_modules())[owner_name]
        state = _state_of(module, owner)
        shape = next(param.shape for param in state.params if param.shard is p)
        out[name] = DTensor(p, state.spec(shape), GradPlacements(state.placements, True))
    return {**out, **persistent_buffers(module)}


def _state_of(root: Module, owner: Module) -> FSDPState:
    """The unit that holds ``owner``'s parameters: the innermost fully_shard above it."""
    best = None
    for _, m in root.named_modules():
        if "_fsdp_state" in m.__dict__ and any(x is owner for x in m.modules()):
            best = m.__dict__["_fsdp_state"]     # named_modules goes outer to inner
    return best
