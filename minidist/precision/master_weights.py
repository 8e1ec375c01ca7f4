"""FP32 master weights behind a low-precision model copy.

Mixed-precision training keeps two copies of each weight:

    model copy w16  (fp16 / bf16 values)  used in forward and backward
    master   w32    (float32)             what the optimizer updates

    step:  g16 = round(dL/dw16)            the low-precision gradients
           g32 = g16 (exact upcast);  w32 <- optimizer(w32, g32)
           w16 = round(w32)

The master copy matters because an update much smaller than a weight is lost
when added in fp16 (1 + 2^-12 == 1 in fp16), but accumulates in float32. Memory
per parameter: 2 (w16) + 2 (g16) + 4 (w32) + 4 + 4 (Adam's m, v) = 16 bytes,
the same as pure float32 training; the savings are in activations and in the
bytes that gradients move across ranks.

Here both copies are float32 arrays; the model copy holds only values the
format can represent (``quantize``).

    master = MasterWeights(model.parameters(), "fp16")
    opt = AdamW(master.params, lr=3e-4)
    ...
    loss.backward()
    master.grads_to_master()     # round model grads, hand them to the master copy
    opt.step()
    master.master_to_model()     # round the updated weights into the model
"""
from __future__ import annotations

from typing import Iterable

from minidist.autograd.tensor import Tensor
from minidist.precision.formats import FloatFormat, get_format
from minidist.precision.rounding import quantize


class MasterWeights:
    def __init__(self, model_params: Iterable[Tensor], fmt: FloatFormat | str):
        self.fmt = get_format(fmt)
        self.model_params = list(model_params)
        for p in self.model_params:
            if p.data.dtype.name not in ("float32", "float64"):
                raise TypeError(f"model parameters must be float32 / float64 arrays "
                                f"(the format is emulated), got {p.data.dtype}")
        # the float32 master copy, as leaves the optimizer can own
        self.params = [Tensor(p.data.copy(), requires_grad=True) for p in self.model_params]
        self.master_to_model()

    def grads_to_master(self) -> None:
        """master.grad = round(model.grad) (inf where it overflows, for GradScaler to see)."""
        for p, m in zip(self.model_params, self.params):
            m.grad = None if p.grad is None else quantize(p.grad, self.fmt)

    def master_to_model(self) -> None:
        """model weights = round(master weights), in place."""
        for p, m in zip(self.model_params, self.params):
            p.data[...] = quantize(m.data, self.fmt)
