"""One layout's run: the same model, seed and global batches, and what each rank saw per step.

Every rank records, per step, the whole-batch loss (the last pipeline stage's, its
data shard's mean), each gradient as the optimizer is about to use it (after the
data-parallel average and the tied embedding's sum) and each parameter after the
step. A rank holds pieces of the tensors; to say which, the dense model's arrays
of *flat indices* go through the layout's own slicing (``shard_of``), so a piece
travels with the dense positions of its elements:

    piece = (index (k,), values (k,))     dense.flat[index] == values

``single`` is the plain model in one process: every tensor whole (index None). A layout
of dp_replicate, tp and pp runs on the 3D entry point, any other on parallelize_llama (or
parallelize_gpt): FSDP pieces travel with their dense indices the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from minidist import backend
from minidist.nn import GPT, GPTConfig
from minidist.nn.llama import Llama, LlamaConfig
from minidist.optim import SGD
from minidist.parallel.compare.layout import DEGREES, Layout, runs_on_three_d
from minidist.precision import autocast


@dataclass
class RunSpec:
    """What both runs share."""
    batches: list                 # [(idx (B, T), targets (B, T))] as host int arrays, one a step
    vocab_size: int               # the corpus's characters
    model: str = "gpt"            # "gpt" | "llama" | "moe_llama" (4 experts, top 2, its
                                  # balancing loss)
    dtype: str = "float64"        # parameters and activations
    seed: int = 0                 # weight init
    lr: float = 0.1               # SGD's


@dataclass
class Plant:
    """A fault planted on purpose (tests): each hook is called on every rank."""
    on_model: Callable | None = None   # (model, rank) once, after the layout's model is built
    on_grads: Callable | None = None   # (step, rank, {name: parameter}) before each optimizer step


@dataclass
class StepRecord:
    loss: float | None                                  # None off the last pipeline stage
    grads: dict = field(default_factory=dict)           # name -> (index or None, values)
    params: dict = field(default_factory=dict)          # name -> (index or None, values)


def model_config(spec: RunSpec) -> GPTConfig | LlamaConfig:
    """A small GPT or Llama for the corpus (4 layers: every pipeline schedule splits it;
    untied embeddings, whose two gradient halves a pipeline would add in another order)."""
    block = spec.batches[0][0].shape[1]
    if spec.model in ("llama", "moe_llama"):
        moe = dict(num_local_experts=4, num_experts_per_tok=2,
                   router_aux_loss_coef=0.02) if spec.model == "moe_llama" else {}
        return LlamaConfig(vocab_size=spec.vocab_size, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                           max_position_embeddings=block, dtype=spec.dtype, seed=spec.seed,
                           **moe)
    return GPTConfig(block_size=block, vocab_size=spec.vocab_size, n_layer=4, n_head=2,
                     n_embd=16, tie_weights=False, dtype=spec.dtype, seed=spec.seed)


class _Recording:
    """The optimizer, recording the gradients it is handed (and letting a plant touch them)."""

    def __init__(self, named: dict, lr: float, index: dict, plant: Plant | None, rank: int):
        self.named, self.index, self.plant, self.rank = named, index, plant, rank
        self.opt = SGD(list(named.values()), lr=lr)
        self.step_count, self.grads = 0, {}

    def step(self) -> None:
        if self.plant is not None and self.plant.on_grads is not None:
            self.plant.on_grads(self.step_count, self.rank, self.named)
        self.grads = _pieces({n: q.grad for n, q in self.named.items()}, self.index)
        self.opt.step()
        self.step_count += 1

    def zero_grad(self) -> None:
        self.opt.zero_grad()


def _pieces(arrays: dict, index: dict) -> dict:
    """name -> (flat dense indices or None, flat values) on the host."""
    return {name: (index.get(name), backend.to_host(a).reshape(-1).copy())
            for name, a in arrays.items() if a is not None}


def _dense(spec: RunSpec) -> Any:
    cfg = model_config(spec)
    return Llama(cfg) if isinstance(cfg, LlamaConfig) else GPT(cfg)


def _build(spec: RunSpec, layout: Layout) -> tuple[Any, dict, dict]:
    """(model, {name: parameter}, {name: flat dense indices of this rank's piece})."""
    if layout.single:
        model = _dense(spec)
        return model, dict(model.named_parameters()), {}
    virtual = 2 if layout.schedule == "interleaved" else 1
    if runs_on_three_d(layout):
        from minidist.comm import DeviceMesh
        from minidist.parallel.three_d import ThreeDParallelGPT
        mesh = DeviceMesh(dp=layout.dp_replicate, pp=layout.pp, tp=layout.tp)
        model = ThreeDParallelGPT(model_config(spec), mesh, layout.microbatches,
                                  layout.schedule, virtual)
    else:
        from minidist.parallel.compose.parallel_dims import ParallelDims
        from minidist.parallel.compose.parallelize import parallelize_gpt, parallelize_llama
        dims = ParallelDims(**{d: getattr(layout, d) for d in DEGREES})
        dense = _dense(spec)
        make = parallelize_llama if isinstance(dense.config, LlamaConfig) else parallelize_gpt
        model = make(dense, dims.build_mesh(), dims, layout.microbatches, layout.schedule,
                     virtual)
    xp = backend.xp
    flat = {n: xp.arange(q.data.size, dtype="int64").reshape(q.data.shape)
            for n, q in _dense(spec).named_parameters()}
    index = {n: backend.to_host(a).reshape(-1).copy() for n, a in model.shard_of(flat).items()}
    return model, model.named_parameters(), index


def sharding_on_rank(spec: RunSpec, layout: Layout, name: str) -> str:
    """On every rank of the layout: the table of which ranks hold which block of ``name``."""
    from minidist.parallel.compose.visualize import sharding_text
    model, _, _ = _build(spec, layout)
    return sharding_text(model, name)


def run_layout(spec: RunSpec, layout: Layout, plant: Plant | None = None) -> list[StepRecord]:
    """On every rank of the layout (or the one process of ``single``): train and record."""
    import minidist.distributed as dist
    rank = 0 if layout.single else dist.get_rank()
    model, named, index = _build(spec, layout)
    if plant is not None and plant.on_model is not None:
        plant.on_model(model, rank)
    opt = _Recording(named, spec.lr, index, plant, rank)
    records = []
    for idx, tgt in spec.batches:
        idx, tgt = backend.from_host(idx), backend.from_host(tgt)
        with autocast(layout.amp or "bf16", enabled=layout.amp is not None):
            loss = _step(model, layout, idx, tgt, opt)
        params = _pieces({n: q.data for n, q in named.items()}, index)
        records.append(StepRecord(loss, opt.grads, params))
    return records


def _step(model: Any, layout: Layout, idx: Any, tgt: Any, opt: _Recording) -> float | None:
    """One step: the 3D entry point's (its data shard's loss on the last stage), the
    composed one's (the batch's loss, kept on rank 0 only: every rank holds the same), or
    forward and backward of the whole batch and the optimizer's (single)."""
    if layout.single:
        _, loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.item())
    loss = model.train_step(idx, tgt, opt)
    if runs_on_three_d(layout):
        return loss
    import minidist.distributed as dist
    return loss if dist.get_rank() == 0 else None
