"""3D parallelism: data x pipeline x tensor parallel GPT (or Llama) training on one mesh.

The world of dp x pp x tp ranks is a ``DeviceMesh`` (comm/mesh.py): tensor-parallel
groups are neighbouring ranks (where the bandwidth is: TP communicates in every
layer), pipeline stages are farthest apart (PP sends only at stage boundaries),
data-parallel replicas in between (worked solutions, "3D layout": TP=8 inside a
node, PP=8 across nodes, DP=8 copies -> 512 GPUs).

One training step on every rank:

    1. its data-parallel shard of the batch: rows [d B/dp, (d+1) B/dp), cut into
       m micro-batches
    2. the pipeline schedule over its pp group (pipeline/executor.py), each piece a part of
       the TensorParallelGPT whose layers communicate in its tp group
    3. the tied embedding's two gradient halves added across first and last stage
    4. gradients averaged over its dp group (``DataParallelNaive.sync_gradients``:
       one all-reduce per parameter after the pipeline flush; the bucketed DDP
       starts its all-reduces from backward hooks, which here would fire on every
       micro-batch, so the plain after-the-step version is used)
    5. with ``max_grad_norm``: the gradients clipped by the whole model's norm, each
       parameter counted once over the tp and pp groups (parallel/clip.py)
    6. the optimizer steps on the parameters of its pieces

Loss = mean over dp shards of the mean over micro-batches of each micro-batch's
mean: with equal sizes, the mean over the whole batch, as one process computes
it. So the parameters after k steps equal single-process training's, up to the
order of float additions (tests/parallel/test_3d.py; demos/08_3d_parallel.py).
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.comm import DeviceMesh
from minidist.nn.gpt import GPTConfig
from minidist.nn.llama import LlamaConfig
from minidist.nn.module import ModuleList
from minidist.parallel.clip import clip_grad_norm_
from minidist.parallel.data.naive import DataParallelNaive
from minidist.parallel.pipeline.executor import PipelineStats, run_pipeline
from minidist.parallel.pipeline.gpt import (pieces_of_rank, pipeline_parameters, split_gpt,
                                            sync_tied_gradients)
from minidist.parallel.pipeline.schedule import chunks_per_rank, make_schedule, placement
from minidist.parallel.tensor.layers import shard_state_dict
from minidist.parallel.tensor.gpt import TensorParallelGPT
from minidist.parallel.tensor.llama import TensorParallelLlama


class ThreeDParallelGPT:
    """This rank's share of a GPT trained with dp x pp x tp parallelism.

        mesh = DeviceMesh(dp=2, pp=2, tp=2)
        model = ThreeDParallelGPT(cfg, mesh, microbatches=4, schedule="1f1b")
        opt = SGD(model.parameters(), lr=0.1)
        loss = model.train_step(idx, targets, opt)   # the whole batch on every rank

    ``max_grad_norm``: clip every step by the global gradient norm (then kept in
    ``last_grad_norm``, the norm before clipping, the same on every rank).
    A ``LlamaConfig`` trains a Llama the same way (``TensorParallelLlama``): the
    pipeline and the data-parallel average meet it only through the model interface.
    """

    def __init__(self, cfg: GPTConfig | LlamaConfig, mesh: DeviceMesh, microbatches: int,
                 schedule: str = "1f1b", virtual: int = 1, sequence_parallel: bool = False,
                 max_grad_norm: float | None = None):
        self.cfg, self.mesh, self.m = cfg, mesh, microbatches
        self.max_grad_norm, self.last_grad_norm = max_grad_norm, None
        self.tp, self.pp, self.dp = mesh.group("tp"), mesh.group("pp"), mesh.group("dp")
        p, pp_rank = dist.get_world_size(self.pp), dist.get_rank(self.pp)
        self.sequence_parallel = sequence_parallel
        # the whole model's structure on every rank, split in tp; each rank keeps its pieces
        if isinstance(cfg, LlamaConfig):
            self.model = TensorParallelLlama(cfg, self.tp, sequence_parallel)
        else:
            self.model = TensorParallelGPT(cfg, self.tp, sequence_parallel)
        # the chunks each rank holds and where (zb_v: two, in a V: pieces r and 2p - 1 - r)
        virtual, self.placement = chunks_per_rank(schedule, virtual), placement(schedule)
        self.chunks = pieces_of_rank(split_gpt(self.model, p, virtual), pp_rank, p,
                                     self.placement)
        self.ops = make_schedule(schedule, p, microbatches, virtual)[pp_rank]
        # DataParallelNaive wraps one module: a list of this rank's pieces
        self.replica = DataParallelNaive(ModuleList(list(self.chunks)), self.dp)
        self.last_stats: PipelineStats | None = None

    def parameters(self) -> list:
        """The parameters this rank trains (its pieces' shards), each once."""
        return pipeline_parameters(self.chunks)

    def named_parameters(self) -> dict[str, Any]:
        """Name (as in GPT) -> parameter, for this rank's parameters only."""
        mine = {id(q) for q in self.parameters()}
        return {n: q for n, q in self.model.named_parameters() if id(q) in mine}

    def shard_of(self, dense: dict) -> dict:
        """This rank's slices of a dense GPT's arrays (name -> array), for its names."""
        shards = shard_state_dict(self.model, dense)
        return {n: shards[n] for n in self.named_parameters()}

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> float:
        """Clip this rank's gradients by the whole model's gradient norm; returns it."""
        return clip_grad_norm_(self.model, max_norm, self.chunks, self.pp, norm_type)

    def train_step(self, idx: Any, targets: Any, optimizer: Any) -> float | None:
        """One step on the whole batch ``idx``, ``targets`` (B, T), the same on every
        rank; returns the loss of this rank's data shard on the last stage, else None."""
        dp, d = dist.get_world_size(self.dp), dist.get_rank(self.dp)
        B, T = idx.shape
        if B % (dp * self.m):
            raise ValueError(f"batch {B} does not split into dp={dp} shards of "
                             f"{self.m} equal micro-batches")
        rows = B // dp
        mb = rows // self.m
        mine = slice(d * rows, (d + 1) * rows)                         # my data shard
        inputs = [idx[mine][i * mb:(i + 1) * mb] for i in range(self.m)]
        labels = [targets[mine][i * mb:(i + 1) * mb] for i in range(self.m)]
        t = dist.get_world_size(self.tp) if self.sequence_parallel else 1
        shape = (mb, T // t, self.cfg.dims().width)                          # between stages
        stats = run_pipeline(self.ops, self.chunks, self.m, inputs, labels,
                             activation_shape=shape, dtype=self.cfg.dtype, group=self.pp,
                             placement=self.placement)
        sync_tied_gradients(self.model, self.chunks, self.pp)
        self.replica.sync_gradients()                                  # mean over dp
        if self.max_grad_norm is not None:
            self.last_grad_norm = self.clip_grad_norm_(self.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        self.last_stats = stats
        return sum(stats.losses) / len(stats.losses) if stats.losses else None

