"""3D parallelism: data x pipeline x tensor parallel GPT (or Llama) training on one mesh.

The world of dp x pp x tp ranks is a ``DeviceMesh`` (comm/mesh.py): tensor-parallel
groups are neighbouring ranks (where the bandwidth is: TP communicates in every
layer), pipeline stages are farthest apart (PP sends only at stage boundaries),
data-parallel replicas in between (worked solutions, "3D layout": TP=8 inside a
node, PP=8 across nodes, DP=8 copies -> 512 GPUs).

It is the composition of every dimension (parallel/compose/parallelize.py) with cp = ep = 1
and no dp_shard: one training step on every rank is

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

from minidist.comm import DeviceMesh
from minidist.nn.gpt import GPT, GPTConfig
from minidist.nn.llama import Llama, LlamaConfig
from minidist.parallel.compose.parallelize import MeshGroups, ParallelLlama


class ThreeDParallelGPT(ParallelLlama):
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
        if mesh.shape.get("cp", 1) > 1:
            raise ValueError("ThreeDParallelGPT composes dp x pp x tp; for context parallelism "
                             "use minidist.parallel.parallelize_llama(model, "
                             "ParallelDims(cp=...).build_mesh(), ...)")
        dp, cp = mesh.group("dp"), mesh.group("cp")          # cp: this rank alone
        groups = MeshGroups(pp=mesh.group("pp"), tp=mesh.group("tp"), cp=cp, dp_replicate=dp,
                            dp=dp, dp_cp=dp, fsdp_mesh=None, ep=cp, dp_mod_ep=dp)
        model = Llama(cfg) if isinstance(cfg, LlamaConfig) else GPT(cfg)
        super().__init__(model, groups, microbatches, schedule, virtual, sequence_parallel,
                         max_grad_norm)
        self.mesh = mesh

    def train_step(self, idx: Any, targets: Any, optimizer: Any) -> float | None:
        """One step on the whole batch ``idx``, ``targets`` (B, T), the same on every
        rank; returns the loss of this rank's data shard on the last stage, else None."""
        stats = self.run_step(idx, targets)
        optimizer.step()
        optimizer.zero_grad()
        self.update_moe_bias()          # the routers' selection bias, as one process moves it
        return sum(stats.losses) / len(stats.losses) if stats.losses else None
