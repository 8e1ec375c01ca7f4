"""minidist.distributed.tensor.parallel: tensor parallelism as placements (torch's names).

Files, in reading order:

    parameters.py  a parallelized module's parameters: this rank's pieces, their layouts
                as DTensors (parameter_as_dtensor), and in model.state_dict() / load;
                full_state_dict: whole, in the dense model's shapes
    style.py    ColwiseParallel, FusedColwiseParallel (c_attn's q, k, v head by head),
                RowwiseParallel, SequenceParallel, PrepareModuleInput: a module's
                parameters, inputs and outputs as placements; Megatron's f and g fall out
                of redistribute's forward and backward
    plans.py    gpt_tp_plan, llama_tp_plan: the whole model's plan (attention, MLP,
                embeddings, head), with or without sequence parallelism
    api.py      parallelize_module(module, device_mesh, plan): a dict of names to styles
    async_tp.py parallelize_module(..., async_tp=True): the column / row styles' sequence-
                parallel gather / reduce-scatter fused with the matmul (torchtitan's
                enable_async_tp; the rings are distributed/_symmetric_memory/)
    loss.py     loss_parallel(): switches the cross_entropy rule (tensor/_ops/_loss.py)
                to vocab-parallel: three all-reduces of N numbers instead of an
                all-gather of N x V

The hand-written layers of the same math are minidist.parallel.tensor (Megatron's
ColumnParallelLinear / RowParallelLinear); tests hold the two bit for bit equal.
"""
from minidist.distributed.tensor.parallel.api import parallelize_module
from minidist.distributed.tensor.parallel.loss import loss_parallel, vocab_parallel_cross_entropy
from minidist.distributed.tensor.parallel.parameters import full_state_dict, parameter_as_dtensor
from minidist.distributed.tensor.parallel.plans import gpt_tp_plan, llama_tp_plan
from minidist.distributed.tensor.parallel.style import (ColwiseParallel, FusedColwiseParallel,
                                                        ParallelStyle, PrepareModuleInput,
                                                        RowwiseParallel, SequenceParallel)

__all__ = ["parallelize_module", "ParallelStyle", "ColwiseParallel", "FusedColwiseParallel",
           "RowwiseParallel",
           "SequenceParallel", "PrepareModuleInput", "parameter_as_dtensor", "loss_parallel",
           "vocab_parallel_cross_entropy", "gpt_tp_plan", "llama_tp_plan",
           "full_state_dict"]
