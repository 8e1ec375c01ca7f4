"""How to run each strategy on a case's model, one function per strategy: each wraps
or cuts the model on this rank of a 2-rank world and returns the ``Run`` that
``recipe.train`` drives (this rank's share of the batch forward and backward, the
step, the whole parameters it holds). The wiring is what each strategy's own tests
do (tests/parallel/*, tests/distributed/*).

    ddp          DistributedDataParallel, half the rows each
    zero1/2/3    Zero1 / Zero2 / Zero3 (clipping by max_grad_norm, step(scaler))
    fully_shard  a unit per block and the root, half the rows each
    tp           gpt_tp_plan / llama_tp_plan over the world, the whole batch each
    pipeline     two stages, 1F1B over two micro-batches (the loss scaled in the last
                 piece, where torch's pipelining scales it too)
    context      ring attention (even seeds) or Ulysses (odd), half of every sequence
    expert       expert_parallel over ep = 2, half the rows each
"""
from typing import Any, Callable, NamedTuple

from minidist.nn.module import Module
from tests.parallel.compositions.recipe import (B, MAX_NORM, MICRO, T, Case, Run,
                                                host_parameters, make_optimizer, moe_biases,
                                                optimizer_class, plain_step, whole_model)


def _my_rows(*arrays):
    """This rank's rows of each (B, T) host array, as backend arrays."""
    import minidist.distributed as dist
    from minidist import backend
    r, n = dist.get_rank(), dist.get_world_size()
    rows = slice(r * B // n, (r + 1) * B // n)
    return [backend.from_host(a[rows]) for a in arrays]


def _data_parallel_backward(run: Callable) -> Callable:
    """Forward ``run`` (a model or a wrapper) on this rank's rows, backward."""
    def backward(idx, tgt, scale, autocast):
        x, y = _my_rows(idx, tgt)
        with autocast():
            _, loss = run(x, y)
        scale(loss).backward()
    return backward


def _clip(params: list) -> Callable:
    from minidist.optim import clip_grad_norm_
    return lambda max_norm: clip_grad_norm_(params, max_norm)


def ddp(case: Case, model) -> Run:
    from minidist.parallel.data import DistributedDataParallel
    wrapped = DistributedDataParallel(model)
    opt = make_optimizer(case, model.parameters())
    return Run(_data_parallel_backward(wrapped),
               plain_step(case, opt, _clip(list(model.parameters()))),
               lambda: whole_model(model), group=None)


def zero(case: Case, model) -> Run:
    from minidist.parallel import Zero1, Zero2, Zero3
    stage = {"zero1": Zero1, "zero2": Zero2, "zero3": Zero3}[case.strategy]
    cls, kwargs = optimizer_class(case)
    clip = MAX_NORM if case.feature == "clip" else None
    wrapped = stage(model, cls, max_grad_norm=clip, **kwargs)

    def step(scaler):
        wrapped.step(scaler)
        if scaler is not None:
            scaler.update()
        wrapped.zero_grad()

    def parameters():
        out = {k: v.copy() for k, v in host_parameters(
            (n, _Data(a)) for n, a in wrapped.full_state_dict().items()).items()}
        out.update(moe_biases(model))
        return out

    whole = parameters if case.strategy == "zero3" else (lambda: whole_model(model))
    return Run(_data_parallel_backward(wrapped), step, whole, group=None)


class _Data:
    """An array dressed as a parameter (``.data``), for host_parameters."""

    def __init__(self, data: Any):
        self.data = data


def fully_shard(case: Case, model) -> Run:
    from minidist.distributed.fsdp import fully_shard as shard
    from minidist.distributed.fsdp import sharded_state_dict
    for block in model.blocks:
        shard(block)
    shard(model)
    opt = make_optimizer(case, model.parameters())

    def parameters():
        out = host_parameters((n, d.full_tensor()) for n, d in sharded_state_dict(model).items()
                              if hasattr(d, "full_tensor"))   # the buffers: moe_biases
        out.update(moe_biases(model))
        return out

    return Run(_data_parallel_backward(model),
               plain_step(case, opt, _clip(list(model.parameters()))), parameters, group=None)


def tp(case: Case, model) -> Run:
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import (gpt_tp_plan, llama_tp_plan,
                                                      parallelize_module)
    from tests.distributed.gathered import whole_parameters
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    plan = gpt_tp_plan if case.model == "gpt" else llama_tp_plan
    parallelize_module(model, mesh, plan(model.config, 2))
    opt = make_optimizer(case, model.parameters())

    def backward(idx, tgt, scale, autocast):
        with autocast():
            _, loss = model(backend.from_host(idx), backend.from_host(tgt))
        scale(loss).backward()

    def parameters():
        out = whole_parameters(model)
        out.update(moe_biases(model))
        return out

    return Run(backward, plain_step(case, opt, _clip(list(model.parameters()))), parameters,
               group=mesh.get_group("tp"))


def pipeline(case: Case, model) -> Run:
    import numpy as np

    import minidist.distributed as dist
    from minidist import backend
    from minidist.parallel import clip_grad_norm_
    from minidist.parallel.pipeline import (make_schedule, pieces_of_rank, pipeline_parameters,
                                            run_pipeline, split_gpt, sync_tied_gradients)
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = pieces_of_rank(split_gpt(model, p), r, p)
    mine = pipeline_parameters(chunks)
    ids = {id(q) for q in mine}
    opt = make_optimizer(case, mine)
    width = model.config.n_embd if case.model == "gpt" else model.config.hidden_size

    def backward(idx, tgt, scale, autocast):
        pieces = [_ScaledLoss(c, scale) if c.last else c for c in chunks]
        with autocast():
            run_pipeline(make_schedule("1f1b", p, MICRO)[r], pieces, MICRO,
                         [backend.from_host(a) for a in np.split(idx, MICRO)],
                         [backend.from_host(a) for a in np.split(tgt, MICRO)],
                         activation_shape=(B // MICRO, T, width), dtype="float64")
        sync_tied_gradients(model, chunks)

    def parameters():
        held = {id(m) for c in chunks for m in c.modules()}
        out = host_parameters((n, q) for n, q in model.named_parameters() if id(q) in ids)
        out.update(moe_biases(model, lambda moe: id(moe) in held))
        return out

    step = plain_step(case, opt, lambda max_norm: clip_grad_norm_(model, max_norm, chunks))
    return Run(backward, step, parameters, group=None if case.feature == "scaler" else "alone")


class _ScaledLoss(Module):
    """The last pipeline piece, its loss times the scaler's scale."""

    def __init__(self, piece: Module, scale: Callable):
        super().__init__()
        self.piece = piece
        object.__setattr__(self, "scale", scale)      # a function, not a module

    def forward(self, x, targets=None):
        return self.scale(self.piece(x, targets))


def context(case: Case, model) -> Run:
    import minidist.distributed as dist
    from minidist import backend
    from minidist.parallel.context.llama import (average_gradients, context_parallel,
                                                 sequence_positions, shard_tokens)
    kind = "ring" if case.seed % 2 == 0 else "ulysses"
    context_parallel(model, kind=kind)
    r, n = dist.get_rank(), dist.get_world_size()
    opt = make_optimizer(case, model.parameters())

    def backward(idx, tgt, scale, autocast):
        pos = sequence_positions(T, r, n, kind)
        x, y = (shard_tokens(backend.from_host(a), r, n, kind) for a in (idx, tgt))
        with autocast():
            _, loss = model(x, y, position_ids=pos)
        scale(loss).backward()
        average_gradients(model)

    return Run(backward, plain_step(case, opt, _clip(list(model.parameters()))),
               lambda: whole_model(model), group=None)


def expert(case: Case, model) -> Run:
    from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                          sync_expert_parallel_gradients)
    mesh = ExpertMesh(ep=2)
    expert_parallel(model, mesh)
    opt = make_optimizer(case, model.parameters())
    forward = _data_parallel_backward(model)

    def backward(idx, tgt, scale, autocast):
        forward(idx, tgt, scale, autocast)
        sync_expert_parallel_gradients(model, mesh)

    return Run(backward, plain_step(case, opt, _clip(list(model.parameters()))),
               lambda: whole_model(model), group=None)


STRATEGY = {"ddp": ddp, "zero1": zero, "zero2": zero, "zero3": zero,
            "fully_shard": fully_shard, "tp": tp, "pipeline": pipeline, "context": context,
            "expert": expert}


class Refused(NamedTuple):
    """What a rank raised instead of training: a refusal (every rank raises it as the
    strategy wraps the model, before any collective of the step)."""
    error: str          # the exception's class name
    message: str


def run_case(case: Case) -> dict | Refused:
    """Every rank: the case trained under its strategy -> the whole parameters it holds,
    or the refusal it raised (caught here, so the world stays up for the next case)."""
    from tests.parallel.compositions.recipe import train
    try:
        return train(case, STRATEGY[case.strategy])
    except (TypeError, ValueError) as e:
        return Refused(type(e).__name__, str(e))
