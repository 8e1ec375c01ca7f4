"""Per-rank bytes of model states, counted from the arrays a rank actually holds.

The source documents' table (minidist.calc.memory), bytes per parameter with Adam:

    precision   weights  grads  optimizer            DDP   ZeRO-1      ZeRO-2      ZeRO-3
    mixed       2        2      12 (master, m, v)    16    4 + 12/N    2 + 14/N    16/N
    fp32        4        4      8  (m, v)            16    8 + 8/N     4 + 12/N    16/N

The wrappers (data/ddp.py, zero12.py, zero3.py) report the three parts from their live
arrays; the tests and demos/05_zero.py put them beside these formulas. Shards
are padded to a multiple of N elements, so a sharded part is ceil(P/N) elements
per rank, not P/N.

Mixed precision is emulated (fp16 / bf16 *values* in float32 arrays, see
minidist.precision), so weights and gradients of a mixed-precision model are
counted at the format's width, 2 bytes, as a real fp16 array would take.
The optimizer's part is ``minidist.optim.optimizer.optimizer_bytes``.
"""
from __future__ import annotations


def report(params: int, grads: int, optimizer: int) -> dict:
    """{'params', 'grads', 'optimizer', 'total'} in bytes."""
    return dict(params=int(params), grads=int(grads), optimizer=int(optimizer),
                total=int(params + grads + optimizer))
