"""parallelize_llama: one Llama (dense or MoE) over every dimension of one named mesh.

    dims = ParallelDims(dp_shard=2, cp=2, pp=2)           # 8 ranks
    mesh = dims.build_mesh()
    model = parallelize_llama(Llama(cfg), mesh, dims, microbatches=2, schedule="1f1b")
    loss = model.train_step(idx, targets, optimizer)       # the whole batch on every rank

torchtitan's order, each step on what the one before left:

    1. tensor parallel   Megatron's column / row split of every matrix over ``tp``
                         (parallel/tensor/llama.py); an MoE stays whole on each tp rank
    2. context parallel  every attention through ring attention (zigzag) or Ulysses over
                         ``cp``; each rank's tokens at their global positions
    3. expert parallel   each MoE's experts spread over ``ep`` (dp_shard_in_ep x cp): the
                         tokens go to their experts and back by two all-to-alls
    4. pipeline split    this rank's pieces of the model over ``pp`` (any schedule); the
                         MoE balancing loss carried across them (pipeline/balance.py)
    5. data parallel     fully_shard of every block and piece over (dp_replicate,
                         dp_shard_cp) (HSDP; FSDP when dp_replicate = 1); without
                         dp_shard x cp: the replicas' gradients averaged after the step
                         (the 3D entry point's DataParallelNaive). Experts are left out of
                         fully_shard: each one's gradient is summed over ``dp_mod_ep`` (the
                         ranks holding it) and divided by dp_cp, torchtitan's divide factor.

Why this order: TP and CP change what a layer computes (its shapes, its attention), EP
which module holds the experts, and the pipeline which layers a rank holds; FSDP then
shards whatever parameters are left on the rank, so it comes last.

One step, every rank: its rows of the batch (``dp``), its tokens of each row (``cp``),
cut into micro-batches; the schedule over ``pp``; the tied embedding's halves added
over ``pp``; the data-parallel means; the whole model's gradient norm (each piece
counted once over tp, dp_shard_cp, ep and pp: parallel/clip.py) and clipping; the
optimizer. The loss returned is the whole batch's on every rank: the last stage's
mean over micro-batches, averaged over ``dp_cp``, sent to every stage.

The routers' statistics are summed over the ranks holding other tokens of the same
micro-batch: ``cp`` (parts of each sequence) and ``dp`` (other rows), never ``tp``
(the same tokens). So every layout trains what one process trains on the same
micro-batches: tests/parallel/test_parallelize.py, to 1e-12 in float64.
Docs: docs/3d_parallel.md, "Every dimension on one mesh".
"""
from __future__ import annotations

from typing import Any, NamedTuple

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp
from minidist.distributed._shared_tokens import TokenShare
from minidist.nn.llama import LlamaConfig
from minidist.nn.module import Module, ModuleList
from minidist.nn.module import persistent_buffers
from minidist.nn.moe import routers
from minidist.parallel.clip import clip_grad_norm_
from minidist.parallel.data.naive import DataParallelNaive
from minidist.parallel.pipeline.balance import balance_relay
from minidist.parallel.pipeline.executor import PipelineStats, run_pipeline
from minidist.parallel.pipeline.gpt import (pieces_of_rank, pipeline_parameters, split_gpt,
                                            sync_tied_gradients)
from minidist.parallel.pipeline.schedule import chunks_per_rank, make_schedule, placement
from minidist.parallel.tensor.gpt import TensorParallelGPT
from minidist.parallel.tensor.layers import shard_state_dict
from minidist.parallel.tensor.llama import TensorParallelLlama


class MeshGroups(NamedTuple):
    """The group each dimension's collectives run on, through this rank (a dimension of
    size 1 is a group of this rank alone)."""
    pp: Any              # pipeline sends, the gradient norm's sum over stages
    tp: Any              # Megatron's f and g, vocab-parallel loss
    cp: Any              # ring attention's K/V blocks (or Ulysses' all-to-alls)
    dp_replicate: Any    # replicas' gradient mean without FSDP
    dp: Any              # the rows of the batch: routers' counts summed ("batch")
    dp_cp: Any           # the loss shown; everything holding other tokens
    fsdp_mesh: Any       # (dp_replicate, dp_shard_cp) or (dp_shard_cp,) mesh, or None
    ep: Any              # the experts' all-to-alls
    dp_mod_ep: Any       # the ranks holding the same experts


def groups_of(world_mesh: Any, dims: Any) -> MeshGroups:
    """The groups of a mesh made by ``ParallelDims.build_mesh``."""
    fsdp = None
    if dims.fsdp_enabled:
        fsdp = world_mesh["dp_replicate", "dp_shard_cp"] if dims.dp_replicate > 1 \
            else world_mesh["dp_shard_cp"]
    group = {name: world_mesh[name].get_group() for name in
             ("pp", "tp", "cp", "dp_replicate", "dp", "dp_cp", "ep", "dp_mod_ep")}
    return MeshGroups(fsdp_mesh=fsdp, **group)


def _size(group: Any) -> int:
    return dist.get_world_size(group)


def _rank(group: Any) -> int:
    return dist.get_rank(group)


class ParallelLlama:
    """This rank's share of a Llama (or GPT) trained over every dimension (module
    docstring); made by ``parallelize_llama`` / ``parallelize_gpt``."""

    def __init__(self, model: Module, groups: MeshGroups, microbatches: int = 1,
                 schedule: str = "1f1b", virtual: int = 1, sequence_parallel: bool = False,
                 max_grad_norm: float | None = None, cp_kind: str = "ring"):
        self.cfg, self.groups, self.m = model.config, groups, microbatches
        self.max_grad_norm, self.last_grad_norm = max_grad_norm, None
        self.sequence_parallel, self.cp_kind = sequence_parallel, cp_kind
        self.tp, self.pp, self.dp = groups.tp, groups.pp, groups.dp_replicate
        self.model = _tensor_parallel(model, groups.tp, sequence_parallel)       # 1
        _context_parallel(self.model, groups.cp, groups.tp, cp_kind)             # 2
        self.experts = _expert_parallel(self.model, groups)                      # 3
        p, pp_rank = _size(groups.pp), _rank(groups.pp)                          # 4
        virtual, self.placement = chunks_per_rank(schedule, virtual), placement(schedule)
        self.chunks = pieces_of_rank(split_gpt(self.model, p, virtual, carry_balance=True),
                                     pp_rank, p, self.placement)
        self.ops = make_schedule(schedule, p, microbatches, virtual)[pp_rank]
        self.relay = balance_relay(self.model, p, virtual, microbatches, groups.pp, self.placement)
        for chunk in self.chunks:
            chunk.relay = self.relay
        self.replica = _data_parallel(self.model, self.chunks, groups, self.experts)   # 5
        _share_tokens(self.model, groups)
        self.last_stats: PipelineStats | None = None
        self.interleave = True     # dualpipe_v's F&B: the halves take turns at each all-to-all

    # -- what this rank holds ---------------------------------------------------------
    def parameters(self) -> list:
        """The parameters this rank trains (its pieces' shards), each once."""
        return pipeline_parameters(self.chunks)

    def named_parameters(self) -> dict[str, Any]:
        """Name (as in the dense model) -> parameter, for this rank's parameters only."""
        mine = {id(q) for q in self.parameters()}
        return {n: q for n, q in self.model.named_parameters() if id(q) in mine}

    def named_buffers(self) -> dict[str, Any]:
        """Name -> array of the persistent buffers of this rank's pieces (the routers'
        ``expert_bias``), what a checkpoint of its stage holds beside the parameters."""
        mine = {id(b) for chunk in self.chunks for b in chunk.buffers()}
        return {n: b for n, b in persistent_buffers(self.model).items() if id(b) in mine}

    def shard_of(self, dense: dict) -> dict:
        """This rank's pieces of a dense model's arrays (name -> array), for its names: the
        tensor-parallel slice, then (under FSDP) its Shard(0) piece over dp_shard_cp."""
        from minidist.distributed.fsdp.hsdp import data_parallel_mesh
        from minidist.distributed.tensor import distribute_tensor
        slices = shard_state_dict(self.model, dense)
        experts = {id(q) for q in self.experts}
        out = {}
        for name, q in self.named_parameters().items():
            piece = slices[name]
            if self.groups.fsdp_mesh is not None and id(q) not in experts:
                fsdp = data_parallel_mesh(self.groups.fsdp_mesh)
                piece = distribute_tensor(piece, fsdp.mesh, fsdp.placements).to_local().data
            out[name] = piece
        return out

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip this rank's gradients by the whole model's gradient norm; returns it."""
        return clip_grad_norm_(self.model, max_norm, self.chunks, self.pp, norm_type)

    # -- one step ---------------------------------------------------------------------
    def my_microbatches(self, idx: Any, targets: Any) -> tuple[list, list]:
        """This rank's rows (over dp) and tokens (over cp) of the batch, in micro-batches."""
        from minidist.parallel.context.llama import shard_tokens
        dp, d = _size(self.groups.dp), _rank(self.groups.dp)
        B = idx.shape[0]
        if B % (dp * self.m):
            raise ValueError(f"batch {B} does not split into dp={dp} shards of "
                             f"{self.m} equal micro-batches")
        rows, cp = B // dp, _size(self.groups.cp)
        mb = rows // self.m

        def cut(a: Any) -> list:
            mine = a[d * rows:(d + 1) * rows]                          # my data shard
            if cp > 1:                                                 # my tokens
                mine = shard_tokens(mine, _rank(self.groups.cp), cp, self.cp_kind)
            return [mine[i * mb:(i + 1) * mb] for i in range(self.m)]
        return cut(idx), cut(targets)

    def run_step(self, idx: Any, targets: Any) -> PipelineStats:
        """Forward and backward of every micro-batch, the gradients made whole-model
        (tied embedding, data-parallel means), clipped if asked. Once per optimizer
        step, from zeroed gradients: the gradient accumulation is its micro-batches
        (``microbatches``); a second call would sync, average and clip again."""
        _refuse_unzeroed(pipeline_parameters(self.chunks))
        inputs, labels = self.my_microbatches(idx, targets)
        cp = _size(self.groups.cp)
        if cp > 1:        # RoPE turns each token by its place in the whole sequence
            from minidist.parallel.context.llama import sequence_positions
            positions = sequence_positions(idx.shape[1], _rank(self.groups.cp), cp, self.cp_kind)
            for chunk in self.chunks:
                chunk.position_ids = positions
        T = inputs[0].shape[1]
        t = _size(self.tp) if self.sequence_parallel else 1
        shape = (inputs[0].shape[0], T // t, self.cfg.dims().width)    # between stages
        stats = run_pipeline(self.ops, self.chunks, self.m, inputs, labels,
                             activation_shape=shape, dtype=self.cfg.dtype, group=self.pp,
                             placement=self.placement, interleave=self.interleave)
        if self.relay is not None:
            self.relay.finish()
        sync_tied_gradients(self.model, self.chunks, self.pp)
        if self.replica is not None:
            self.replica.sync_gradients()                              # mean over dp
        _sync_experts(self.experts, self.groups)
        if self.max_grad_norm is not None:
            self.last_grad_norm = self.clip_grad_norm_(self.max_grad_norm)
        self.last_stats = stats
        return stats

    def whole_loss(self, stats: PipelineStats) -> float:
        """The batch's loss on every rank: the last stage's, averaged over dp_cp."""
        last = stats.losses
        value = backend.from_host([sum(last) / len(last) if last else 0.0], "float64")
        dist.all_reduce(value, group=self.groups.dp_cp)
        value /= _size(self.groups.dp_cp)
        if _size(self.pp) > 1:
            dist.all_reduce(value, group=self.pp)        # only the last stage's is not 0
        return float(backend.to_host(value)[0])

    def train_step(self, idx: Any, targets: Any, optimizer: Any) -> float:
        """One step on the whole batch ``idx``, ``targets`` (B, T), the same on every
        rank; returns the batch's loss, the same on every rank."""
        stats = self.run_step(idx, targets)
        optimizer.step()
        optimizer.zero_grad()
        self.update_moe_bias()
        return self.whole_loss(stats)

    def update_moe_bias(self) -> None:
        """DeepSeek-V3 balancing after each optimizer step (no-op when off), as
        ``Llama.update_moe_bias``: every router of this rank's pieces."""
        for moe in routers(self.model):
            moe.update_bias()


def _refuse_unzeroed(params: list) -> None:
    """Raise if a parameter holds a nonzero gradient: a second run_step before a step would
    add the tied half, the experts' sums and the replicas' means onto the first's."""
    grads = [q.grad for q in params if q.grad is not None]
    if grads and bool(backend.to_host(xp.stack([xp.any(g) for g in grads])).any()):
        raise RuntimeError(
            "ParallelLlama.run_step: the last run_step's gradients are still there; a second "
            "would sync the tied embedding, average the experts and clip again onto them. Call "
            "optimizer.step() and optimizer.zero_grad() between (train_step does), and "
            "accumulate over more micro-batches (microbatches=) instead")


def _tensor_parallel(model: Module, tp: Any, sequence_parallel: bool) -> Module:
    """The Megatron twin of ``model`` over ``tp``: its weights, frozen where they are, and
    its persistent buffers (each router's ``expert_bias``: one from the config had zeros)."""
    cfg = model.config
    cls = TensorParallelLlama if isinstance(cfg, LlamaConfig) else TensorParallelGPT
    twin = cls(cfg, tp, sequence_parallel)
    twin.load_state_dict(shard_state_dict(twin, model.state_dict()))   # buffers too
    dense = dict(model.named_parameters())
    for name, q in twin.named_parameters():
        q.requires_grad = dense[name].requires_grad
    return twin


def _context_parallel(model: Module, cp: Any, tp: Any, kind: str) -> None:
    """Every attention of ``model`` over ``cp`` (context/llama.py). Ulysses regroups the
    heads a rank holds after tensor parallelism (nh / tp and nkv / tp) over cp, so cp
    must divide those."""
    n, t = _size(cp), _size(tp)
    if n == 1:
        return
    from minidist.parallel.context.llama import context_parallel
    cfg = model.config
    for name in ("num_attention_heads", "num_key_value_heads"):
        if kind == "ulysses" and (getattr(cfg, name) // t) % n:
            raise ValueError(f"Ulysses splits each rank's heads over cp: {name}="
                             f"{getattr(cfg, name)} / tp={t} is not divisible by cp={n}; use "
                             "ring attention (cp_kind='ring'), or degrees whose tp x cp "
                             "divides the heads")
    context_parallel(model, cp, kind)


def _expert_parallel(model: Module, groups: MeshGroups) -> list:
    """Every MoE's experts over ``ep``; returns this rank's expert parameters."""
    if _size(groups.ep) == 1:
        return []
    from minidist.parallel.expert import ExpertMesh, expert_parallel
    mesh = ExpertMesh.of_groups(groups.ep, groups.dp_mod_ep, groups.dp_cp)
    expert_parallel(model, mesh)
    return [q for moe in routers(model) for q in moe.experts.parameters()]


def _data_parallel(model: Module, chunks: list, groups: MeshGroups,
                   experts: list) -> DataParallelNaive | None:
    """fully_shard of every block and piece over the FSDP mesh (experts left out), or,
    without one, the replicas' mean after the step (returned)."""
    if groups.fsdp_mesh is None:
        return DataParallelNaive(ModuleList(list(chunks)), groups.dp_replicate)
    if model.config.dims().tied and _size(groups.pp) > 1:
        raise ValueError("tied embeddings on a pipeline under fully_shard: the first and the "
                         "last stage would shard two copies apart; untie them "
                         "(tie_word_embeddings=False) or use dp_replicate without dp_shard/cp")
    from minidist.distributed.fsdp import fully_shard
    for chunk in chunks:
        for block in chunk.blocks:
            fully_shard(block, mesh=groups.fsdp_mesh, ignored_params=set(experts))
        fully_shard(chunk, mesh=groups.fsdp_mesh, ignored_params=set(experts))
    return None


def _sync_experts(experts: list, groups: MeshGroups) -> None:
    """Each expert's gradient: the sum over the ranks holding it, divided by dp_cp (every
    rank that holds tokens), as the dense gradients' mean is over dp_cp; one that no rank
    has a gradient of keeps none (``mean_gradients``). A frozen expert (the same on every
    rank) takes no part and keeps no gradient."""
    from minidist.parallel.expert.expert_parallel import mean_gradients
    mean_gradients([q for q in experts if q.requires_grad], groups.dp_mod_ep,
                   _size(groups.dp_cp))


def _share_tokens(model: Module, groups: MeshGroups) -> None:
    """The routers count the tokens of cp ("sequence") and dp ("batch"), nothing else
    (fully_shard's dp_shard_cp would count cp twice, tp holds the same tokens)."""
    sequence = [groups.cp] if _size(groups.cp) > 1 else []
    batch = [groups.dp] if _size(groups.dp) > 1 else []
    for moe in routers(model):
        moe.token_share = TokenShare(moe.balance, sequence, batch) if sequence + batch else None


def parallelize_llama(model: Module, world_mesh: Any, parallel_dims: Any,
                      microbatches: int = 1, schedule: str = "1f1b", virtual: int = 1,
                      sequence_parallel: bool = False, max_grad_norm: float | None = None,
                      cp_kind: str = "ring") -> ParallelLlama:
    """``model`` (a Llama, dense or MoE) over ``world_mesh`` (``parallel_dims.build_mesh()``)
    in torchtitan's order (module docstring); returns this rank's share."""
    parallel_dims.check_model(model.config, model.config.max_position_embeddings)
    return ParallelLlama(model, groups_of(world_mesh, parallel_dims), microbatches, schedule,
                         virtual, sequence_parallel, max_grad_norm, cp_kind)


def parallelize_gpt(model: Module, world_mesh: Any, parallel_dims: Any,
                    microbatches: int = 1, schedule: str = "1f1b", virtual: int = 1,
                    sequence_parallel: bool = False,
                    max_grad_norm: float | None = None) -> ParallelLlama:
    """The GPT the same way; no context parallelism (its learned positions start at 0
    on every shard: parallel/context/llama.py says so)."""
    if parallel_dims.cp > 1:
        from minidist.parallel.context.llama import refuse_without_positions
        refuse_without_positions(model)
    parallel_dims.check_model(model.config)
    return ParallelLlama(model, groups_of(world_mesh, parallel_dims), microbatches, schedule,
                         virtual, sequence_parallel, max_grad_norm)

