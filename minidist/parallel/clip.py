"""Gradient-norm clipping of a model split by tensor and pipeline parallelism.

Clipping needs the norm of the *whole* model's gradient, but each rank holds a
piece, and some pieces twice. Every parameter must be counted exactly once
(Megatron-LM's ``clip_grad_norm``; torch's DTensor clipping does the same):

    tensor parallel     a sliced matrix (column / row / vocabulary-parallel weights,
                        column biases) is registered as a piece over the tp group
                        (autograd/pieces.py): the slices' shares add up over the
                        group; a replicated one (layer norms, position embeddings,
                        row-parallel biases) is whole on every rank and counts once
    pipeline            each stage counts its layers; the tied embedding, held by
                        the first and the last stage, only the first
    data parallel       nothing to add: after the gradient all-reduce every
                        replica holds the same gradient and the same norm

    share_s     = sum over the whole parameters stage s counts of ||g||_p^p
                  + sum over its kinds of piece: all_reduce_sum over the piece's groups
                    (sum over my pieces of ||g||_p^p)                (p = inf: max)
    total_norm  = ( all_reduce_sum over the pp group (share_s) )^(1/p)
    g <- g * max_norm / (total_norm + 1e-6)    on every parameter of every rank, if < 1

The piece rule is ``optim.clip_grad_norm_``'s (``total_grad_share``), so any model
whose cut parameters are registered (``TensorParallelGPT``, ``TensorParallelLlama``,
a ``parallelize_module`` plan) clips alike. Summing every rank's own norm instead
would count each replicated parameter t times and the tied embedding twice: a larger
norm and a step clipped too much (tests/parallel/test_clip.py shows the difference).

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
from minidist.optim.clip import (check_finite, clip_grads_with_norm_, norm_from_share,
                                 refuse_stage_parameters, total_grad_share)
from minidist.parallel.pipeline.gpt import counted_parameters, pipeline_parameters


def parameters_to_count(model: Module, chunks: Sequence[Module] | None = None) -> list:
    """The parameters whose gradients this rank adds to a global norm (see the module
    docstring): each of this rank's parameters once, the tied embedding on the first
    stage only; a tensor-parallel slice counts with the other ranks' slices (its piece
    layout), a replicated parameter whole."""
    return list(model.parameters()) if chunks is None else counted_parameters(model, chunks)


def clip_grad_norm_(model: Module, max_norm: float, chunks: Sequence[Module] | None = None,
                    pp_group: Any = None, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Clip this rank's gradients by the norm of the whole model's gradient.

    model: a ``GPT``, ``Llama`` or their tensor-parallel twins (or any model whose cut
    parameters are registered pieces); chunks: this rank's pipeline pieces, or None
    when the rank runs the whole model (no pipeline); pp_group: the pipeline group
    (None: the world), used only with ``chunks``. Call it after the gradients are
    complete (tied embedding synced, data-parallel average taken) and before the
    step; every rank of the model's groups must call it. Returns the total norm
    before clipping, the same on every rank, as ``optim.clip_grad_norm_`` would
    return for the whole model in one process.
    """
    if chunks is None:         # a pipeline's stage needs its chunks to count the others'
        refuse_stage_parameters(model.parameters())
    trained = list(model.parameters()) if chunks is None else pipeline_parameters(chunks)
    share = total_grad_share(parameters_to_count(model, chunks), norm_type)
    if chunks is not None and dist.get_world_size(pp_group) > 1:
        op = dist.ReduceOp.MAX if float(norm_type) == math.inf else dist.ReduceOp.SUM
        total = backend.from_host([share])                           # (1,) float64
        dist.all_reduce(total, op=op, group=pp_group)
        share = float(backend.to_host(total)[0])
    total_norm = norm_from_share(share, norm_type)
    if error_if_nonfinite:
        check_finite(total_norm, norm_type)
    clip_grads_with_norm_(trained, max_norm, total_norm)
    return total_norm
