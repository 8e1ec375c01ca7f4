"""Measure the model-state bytes one rank holds, for DDP and each ZeRO stage.

The memory report of a wrapper (memory.py) counts the arrays a rank holds
at the moment it is asked. This is the moment the formulas describe: after one
optimizer step (the optimizer state exists) and one more backward (the
gradients exist), with AdamW, in fp32 or mixed precision (fp16 weights and
gradients, a float32 master copy):

    bytes per parameter   DDP 16   ZeRO-1 4 + 12/N   ZeRO-2 2 + 14/N   ZeRO-3 16/N   (mixed)

demos/05_zero.py prints the result beside the formula, and the tests check it.
"""
from __future__ import annotations

from typing import Any

from minidist.optim import AdamW
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.zero.zero12 import Zero1, Zero2
from minidist.parallel.zero.zero3 import Zero3
from minidist.precision import MasterWeights


def model_state_bytes(model: Any, x: Any, stage: int, precision: str) -> dict:
    """This rank's report ({'params', 'grads', 'optimizer', 'total'} in bytes) for
    ``model`` wrapped in DDP (stage 0) or ZeRO-``stage``, after one AdamW step on
    ``x`` and one more backward. ``precision``: ``"fp32"`` or ``"mixed"`` (fp16)."""
    fmt = None if precision == "fp32" else "fp16"
    if stage == 0:
        ddp = DistributedDataParallel(model)
        master = MasterWeights(model.parameters(), fmt) if fmt else None
        opt = AdamW(master.params if master else model.parameters())
        for _ in range(2):
            opt.zero_grad()
            model.zero_grad()
            ddp(x).sum().backward()
            if master:
                master.grads_to_master()
            opt.step()
            if master:
                master.master_to_model()
        return ddp.memory_report(opt, weight_bytes=2 if fmt else None)
    zero = {1: Zero1, 2: Zero2, 3: Zero3}[stage](model, AdamW, precision=fmt)
    zero(x).sum().backward()
    zero.step()
    zero.zero_grad()
    zero(x).sum().backward()
    return zero.memory_report()
