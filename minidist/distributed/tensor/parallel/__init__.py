"""minidist.distributed.tensor.parallel: tensor parallelism as placements (torch's names).

Files, in reading order:

    style.py    ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput:
                a module's parameters, inputs and outputs as placements; Megatron's f and
                g fall out of redistribute's forward and backward
    api.py      parallelize_module(module, device_mesh, plan): a dict of names to styles
    loss.py     loss_parallel(): switches the cross_entropy rule (tensor/_ops/_loss.py)
                to vocab-parallel: three all-reduces of N numbers instead of an
                all-gather of N x V

The hand-written layers of the same math are minidist.parallel.tensor (Megatron's
ColumnParallelLinear / RowParallelLinear); tests hold the two bit for bit equal.
"""
from minidist.distributed.tensor.parallel.api import parallelize_module
from minidist.distributed.tensor.parallel.loss import loss_parallel, vocab_parallel_cross_entropy
from minidist.distributed.tensor.parallel.style import (ColwiseParallel, ParallelStyle,
                                                        PrepareModuleInput, RowwiseParallel,
                                                        SequenceParallel, parameter_as_dtensor)

__all__ = ["parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel",
           "SequenceParallel", "PrepareModuleInput", "parameter_as_dtensor", "loss_parallel",
           "vocab_parallel_cross_entropy"]
