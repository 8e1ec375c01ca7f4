"""``parallelize_module(..., async_tp=True)``: torchtitan's ``enable_async_tp`` on the DTensor path.

torchtitan turns async TP on for the whole tensor-parallel mesh: torch.compile's
micro-pipeline pass finds every all-gather that feeds a matmul and every matmul that feeds
a reduce-scatter, and puts the fused op of ``torch.ops.symm_mem`` in their place. There is
no compiler here, but the styles already say where the pairs are:

    ColwiseParallel(input_layouts=Shard(d)), a Linear:   Y = AG_d(X) @ W_r^T + b_r
        -> fused_all_gather_matmul(X_r, [W_r^T], d)       (the gather overlapped)
    RowwiseParallel(output_layouts=Shard(d)), a Linear:  Z_r = RS_d(X_r @ W_r^T), + b after
        -> fused_matmul_reduce_scatter(X_r, W_r^T, "sum", d)

(FusedColwiseParallel, GPT's c_attn, is a ColwiseParallel: its q | k | v rows are one W_r.)
Every other style, and these two with other layouts (a Replicate input has nothing to
gather: Llama's q/k/v projections, whose input PrepareModuleInput gathers once for the
three), runs as before. As in torchtitan, async TP needs sequence parallelism; a plan
with nothing to fuse is refused rather than silently left alone.

The outputs and gradients are the plain path's within float tolerance (the rings' sums
run in ring order; distributed/_symmetric_memory/). Under autocast the products would be
rounded by F.linear's low-precision path, which the ring does not take: refused.
Tests: tests/distributed/test_parallelize_async_tp.py.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.distributed._symmetric_memory import (fused_all_gather_matmul,
                                                    fused_matmul_reduce_scatter)
from minidist.distributed.tensor.placement_types import Placement, Shard
from minidist.nn.layers import Linear
from minidist.nn.module import Module
from minidist.precision.autocast import get_autocast_policy


def fusable(on: bool, module: Module, layout: Placement) -> bool:
    """Is async TP ``on`` for a style on ``module`` whose sequence side is ``layout``
    (a column style's input, a row style's output)? Refused under autocast."""
    if not (on and isinstance(module, Linear) and isinstance(layout, Shard)):
        return False
    if get_autocast_policy() is not None:
        raise ValueError("parallelize_module(async_tp=True) multiplies in the parameters' "
                         "dtype; under autocast parallelize without async_tp")
    return True


def gather_matmul(module: Linear, x: Tensor, layout: Shard, mesh: Any) -> Tensor:
    """Y = AG(x) @ W_r^T + b_r, the gather along ``layout.dim`` overlapped with the
    products: (B, T/t, in) -> (B, T, out/t)."""
    _, (y,) = fused_all_gather_matmul(x, [module.weight.T], layout.dim % x.ndim,
                                      mesh.get_group())
    return y if module.bias is None else y + module.bias


def matmul_scatter(module: Linear, x: Tensor, layout: Shard, mesh: Any) -> Tensor:
    """Z_r = RS(x @ W_r^T) along ``layout.dim`` (the bias is the caller's, added once
    after the sum): (B, T, in/t) -> (B, T/t, out)."""
    return fused_matmul_reduce_scatter(x, module.weight.T, "sum", layout.dim % x.ndim,
                                       mesh.get_group())
