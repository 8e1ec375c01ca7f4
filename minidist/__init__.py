"""minidist: distributed neural-network training, from scratch, readable.

    import minidist
    x = minidist.Tensor([1.0, 2.0], requires_grad=True)

See README.md and docs/ for the map.
"""
from minidist import backend, trace
from minidist.autograd import (Function, Tensor, concat, enable_grad, gradcheck, no_grad,
                               split, stack, tensor, where)
from minidist.backend import manual_seed
from minidist.comm.launch.world import launch

__version__ = "0.1.0"

# minidist.checkpoint is the save/load package; activation checkpointing is
# minidist.autograd.checkpoint (as torch.utils.checkpoint.checkpoint).
__all__ = ["backend", "trace", "Tensor", "tensor", "Function", "no_grad", "enable_grad",
           "gradcheck", "concat", "stack", "split", "where", "manual_seed", "launch"]
