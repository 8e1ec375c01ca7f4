"""The gradients' reduce-scatter in an emulated low-precision format (``reduce_dtype``).

``MixedPrecisionPolicy(reduce_dtype="bfloat16")`` asks for the reduce-scatter to run
in bf16, as NCCL runs it on bf16 tensors: every value sent is a bf16 number, and
every partial sum is rounded to bf16 again before it goes on. NumPy has no bf16, so
the values stay in their float32 / float64 arrays and are rounded to the format by
minidist.precision (quantize: round to nearest, ties to even), at the same places:

    q_s      = round_fmt(g_s)                              what rank s sends
    acc      = q_0
    acc      = round_fmt(float32(acc) + float32(q_s))      s = 1 .. n-1, in rank order
    mean     = round_fmt(float32(acc) / n)                 reduce_op "avg"

Each addition is done in float32 and rounded to the format, as a bf16 / fp16 add is
on hardware (and in ml_dtypes and torch on the CPU). The order of the partial sums
is fixed: rank 0's piece first, then rank 1's, ... A ring would add them in an order
that depends on the rank that owns the piece; fixing it makes the bits a function of
the inputs alone, so a test can recompute them with ml_dtypes.

How the pieces travel: each rank sends piece j of its (rounded) gradient to rank j
and receives the n contributions to its own piece (an all-to-all), then adds them
as above. That moves (n - 1) / n * M bytes per rank, what a ring reduce-scatter moves;
CommDebugMode counts it as the reduce-scatter it is.

HSDP's all-reduce over the replicas (hsdp.py) in a format: every rank's rounded
values gathered, then round_sum in rank order, so every rank gets the same bits.
It moves (n - 1) * M bytes per rank (a ring all-reduce: 2 (n - 1) / n * M);
CommDebugMode counts it as the all-reduce it stands for.
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp
from minidist.comm.collectives.api import all_gather_into_tensor, all_to_all
from minidist.comm.group import ProcessGroup
from minidist.distributed.tensor._collectives import (OBSERVED, ScatteredDim0, stack_dim0,
                                                      unstack_dim0)
from minidist.precision import quantize
from minidist.precision.formats import FloatFormat, get_format

NATIVE = ("float32", "float64")   # reduce_dtype names that NumPy reduces in directly


def emulated_format(dtype: str | None) -> FloatFormat | None:
    """The emulated format ``dtype`` names ("bfloat16", "float16", "float8_e4m3fn", ...),
    or None for a dtype NumPy has (float32, float64) or no dtype at all."""
    if dtype is None or str(dtype) in NATIVE:
        return None
    try:
        return get_format(str(dtype))
    except ValueError:
        raise ValueError(f"MixedPrecisionPolicy: unknown dtype {dtype!r}; use 'float32', "
                         "'float64', or a format minidist.precision emulates: 'bfloat16', "
                         "'float16', 'float8_e4m3fn', ...") from None


def round_sum(summands: list, fmt: FloatFormat, reduce_op: str) -> Any:
    """The sum (or mean) of ``summands`` (already in ``fmt``) in rank order, every partial
    sum rounded to ``fmt`` (module docstring); an array of the summands' dtype."""
    acc = summands[0]
    for q in summands[1:]:
        acc = quantize(acc.astype("float32") + q.astype("float32"), fmt)
    if reduce_op == "avg":
        acc = quantize(acc.astype("float32") / len(summands), fmt)
    elif reduce_op != "sum":
        raise ValueError(f"a reduce-scatter in {fmt.name} sums or averages, not {reduce_op!r}")
    return acc.astype(summands[0].dtype)


def reduce_scatter_dim0_in_format(fulls: list, reduce_op: str, group: ProcessGroup,
                                  fmt: FloatFormat) -> list:
    """Partial -> Shard(0) of several tensors, reduced in ``fmt``: rank r's pieces of
    round_sum over ranks of each tensor (module docstring)."""
    return start_reduce_scatter_dim0_in_format(fulls, reduce_op, group, fmt, False).wait()


def start_reduce_scatter_dim0_in_format(fulls: list, reduce_op: str, group: ProcessGroup,
                                        fmt: FloatFormat, async_op: bool) -> ScatteredDim0:
    """``reduce_scatter_dim0_in_format``'s ScatteredDim0: the all-to-all done
    (``async_op=False``) or under way; its ``wait()`` adds what was received."""
    n, r = group.size, group.rank
    rounded = [quantize(full, fmt) for full in fulls]
    stacked, shapes = stack_dim0(rounded, n)                         # (n, W)
    received = [stacked[r].copy()]
    work = None
    if n > 1 and stacked.size:
        OBSERVED.note("reduce_scatter_tensor", group, stacked.nbytes)
        inputs = [xp.ascontiguousarray(stacked[j]) for j in range(n)]        # (W,) each
        received = [xp.empty(stacked.shape[1], dtype=stacked.dtype) for _ in range(n)]
        work = all_to_all(received, inputs, group=group,     # received[s]: rank s's piece r
                          async_op=async_op)
    elif n > 1:
        received = [stacked[r].copy() for _ in range(n)]   # nothing to move
    return ScatteredDim0(work, lambda: unstack_dim0(round_sum(received, fmt, reduce_op),
                                                    shapes, r), shapes, r, stacked.dtype)


def all_reduce_in_format(rounded: Any, reduce_op: str, group: ProcessGroup,
                         fmt: FloatFormat, async_op: bool = False) -> tuple[Any, Any]:
    """Partial -> Replicate of a 1-D array of values already in ``fmt`` (C order), reduced
    in ``fmt``: round_sum over the ranks of ``group`` of each rank's values (module
    docstring); the same on every rank. Returns the all-gather's Work (None when done:
    ``async_op=False``) and a function that gives the sum once it is."""
    OBSERVED.note("all_reduce", group, rounded.nbytes)
    everyone = xp.empty((group.size,) + rounded.shape, dtype=rounded.dtype)   # (n, W)
    work = all_gather_into_tensor(everyone, rounded, group=group, async_op=async_op)
    return work, lambda: round_sum([everyone[s] for s in range(group.size)], fmt, reduce_op)
