"""Gradient-norm clipping of a model split by tensor and pipeline parallelism.

Clipping needs the norm of the *whole* model's gradient, but each rank holds a
piece, and some pieces twice. Every parameter must be counted exactly once
(Megatron-LM's ``clip_grad_norm``; torch's DTensor clipping does the same):

    tensor parallel     a sharded matrix (column / row / vocabulary-parallel
                        weights, column biases): each rank counts its slice;
                        a replicated one (layer norms, position embeddings,
                        row-parallel biases): only tensor-parallel rank 0
    pipeline            each stage counts its layers; the tied embedding, held by
                        the first and the last stage, only the first
    data parallel       nothing to add: after the gradient all-reduce every
                        replica holds the same gradient and the same norm

    share_r     = sum over the parameters rank r counts of ||g||_p^p   (p = inf: max |g|)
    total_norm  = ( all_reduce_sum over the tp group, then the pp group (share_r) )^(1/p)
    g <- g * max_norm / (total_norm + 1e-6)    on every parameter of every rank, if < 1

Summing every rank's own norm instead would count each replicated parameter t
times and the tied embedding twice: a larger norm and a step clipped too much
(tests/parallel/test_clip.py shows the difference).

    loss.backward(); sync_tied_gradients(model, chunks, pp)       # as for the step
    norm = clip_grad_norm_(model, max_norm=1.0, chunks=chunks, pp_group=pp)
    optimizer.step()

``ThreeDParallelGPT(..., max_grad_norm=1.0)`` does it inside its step.
Docs: docs/tensor_parallel.md, docs/pipeline.md, docs/3d_parallel.md.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import minidist.distributed as dist
from minidist import backend
from minidist.nn.module import Module
from minidist.optim.clip import (check_finite, clip_grads_with_norm_, grad_norm_share,
                                 norm_from_share)
from minidist.parallel.pipeline.gpt import counted_parameters, pipeline_parameters
from minidist.parallel.tensor.gpt import TensorParallelGPT
from minidist.parallel.tensor.layers import sharded_parameters


def _grads(params: Sequence[Any]) -> list[Any]:
    return [q.grad for q in params if q.grad is not None]


def parameters_to_count(model: Module, chunks: Sequence[Module] | None = None) -> list:
    """The parameters whose gradients this rank adds to a global norm (see the module
    docstring): each parameter of the model is counted by exactly one rank of its
    tensor-parallel x pipeline group."""
    counted = list(model.parameters()) if chunks is None else counted_parameters(model, chunks)
    if isinstance(model, TensorParallelGPT) and dist.get_rank(model.group) != 0:
        sharded = {id(q) for q in sharded_parameters(model)}
        counted = [q for q in counted if id(q) in sharded]       # replicated: rank 0 counts
    return counted


def clip_grad_norm_(model: Module, max_norm: float, chunks: Sequence[Module] | None = None,
                    pp_group: Any = None, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Clip this rank's gradients by the norm of the whole model's gradient.

    model: a ``GPT`` or ``TensorParallelGPT`` (its tensor-parallel group is
    ``model.group``); chunks: this rank's pipeline pieces, or None when the rank
    runs the whole model (no pipeline); pp_group: the pipeline group (None: the
    world), used only with ``chunks``. Call it after the gradients are complete
    (tied embedding synced, data-parallel average taken) and before the step;
    every rank of the model's groups must call it. Returns the total norm
    before clipping, the same on every rank, as ``optim.clip_grad_norm_`` would
    return for the whole model in one process.
    """
    trained = list(model.parameters()) if chunks is None else pipeline_parameters(chunks)
    share = grad_norm_share(_grads(parameters_to_count(model, chunks)), norm_type)
    groups = []
    if isinstance(model, TensorParallelGPT) and dist.get_world_size(model.group) > 1:
        groups.append(model.group)
    if chunks is not None and dist.get_world_size(pp_group) > 1:
        groups.append(pp_group)
    op = dist.ReduceOp.MAX if float(norm_type) == math.inf else dist.ReduceOp.SUM
    total = backend.from_host([share])                               # (1,) float64
    for group in groups:
        dist.all_reduce(total, op=op, group=group)
    total_norm = norm_from_share(float(backend.to_host(total)[0]), norm_type)
    if error_if_nonfinite:
        check_finite(total_norm, norm_type)
    clip_grads_with_norm_(trained, max_norm, total_norm)
    return total_norm
