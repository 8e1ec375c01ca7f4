"""Where two runs part: ulps, the first tensor past the tolerance, and its likely cause.

The distance of two floats in ulps is the count of representable numbers
between them: on the bits read as sign-magnitude integers (IEEE order),

    ulps(a, b) = |ord(a) - ord(b)|,   ord(x) = bits(x) if x >= 0 else -(bits(x) & ~sign)

A tensor parts where some element fails |a - b| <= atol + rtol |b| (``bitwise``:
a == b). Its cause, where it can be told:

    rounding       the layouts round to different formats (amp=bf16 against none)
    reordered sum  max |a - b| within the summation-order bound: a sum of n terms in
                   another order differs by at most gamma_n sum|x_i|, gamma_n = n u / (1 - n u)
                   (u the unit roundoff), here taken coarsely as gamma_n max|b| per step
                   done, n the longest sum in the step (tokens, width or vocabulary)
    bug            neither: a wrong gradient, a missing reduction
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

REORDERED, ROUNDING, BUG = "reordered sum", "rounding", "bug"


@dataclass
class Tolerance:
    atol: float = 1e-9        # absolute
    rtol: float = 1e-6        # relative to the reference (b)
    bitwise: bool = False     # a == b, every bit


@dataclass
class Parting:
    """The first tensor past the tolerance."""
    step: int                 # 0-based training step
    kind: str                 # "loss" | "gradient" | "parameter"
    name: str                 # module path of the parameter ("" for the loss)
    rank: int | None          # a rank of layout a holding the worst element (None: single)
    max_abs: float            # largest |a - b|
    max_ulps: int             # largest distance in ulps
    cause: str                # REORDERED | ROUNDING | BUG
    why: str                  # one sentence saying how the cause was told


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in ulps (module docstring) of two float arrays of one dtype."""
    a, b = np.asarray(a), np.asarray(b)
    ints = {8: np.int64, 4: np.int32, 2: np.int16}[a.dtype.itemsize]
    magnitude = np.iinfo(ints).max

    def order(x):
        bits = x.view(ints).astype(np.int64)
        return np.where(bits < 0, -(bits & magnitude), bits)
    return np.abs(order(a) - order(b))


def past(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> bool:
    if tol.bitwise:
        return not np.array_equal(a.view(np.uint8), b.view(np.uint8))
    return not np.all(np.abs(a - b) <= tol.atol + tol.rtol * np.abs(b))


def pieces_against_dense(views_a: list, dense_b: dict, kind: str) -> Iterator[tuple]:
    """For each name (in dense order) and each rank's piece of layout a: (name, rank, a, b)
    with b the dense reference at the piece's positions."""
    for name, whole in dense_b.items():
        for rank, view in enumerate(views_a):
            if name not in view[kind]:
                continue
            index, values = view[kind][name]
            ref = whole if index is None else whole[index]
            yield name, (None if len(views_a) == 1 else rank), values, ref


def scatter(views: list, kind: str, shapes: dict) -> dict:
    """The dense tensors from every rank's pieces (name -> flat array)."""
    dense = {}
    for name, size in shapes.items():
        out = None
        for view in views:
            if name not in view[kind]:
                continue
            index, values = view[kind][name]
            if out is None:
                out = np.zeros(size, dtype=values.dtype)
            out[slice(None) if index is None else index] = values
        if out is not None:
            dense[name] = out
    return dense


def classify(max_abs: float, scale: float, step: int, longest_sum: int, dtype: str,
             amps: tuple) -> tuple[str, str]:
    """(cause, why) for a difference (module docstring)."""
    if amps[0] != amps[1]:
        names = [a or "no rounding" for a in amps]
        return ROUNDING, f"the layouts round matmuls differently ({names[0]} against {names[1]})"
    u = float(np.finfo(dtype).eps) / 2
    gamma = longest_sum * u / (1 - longest_sum * u)
    bound = gamma * max(scale, np.finfo(dtype).tiny) * (step + 1)
    if max_abs <= bound:
        return REORDERED, (f"max |a - b| = {max_abs:.3e} is within the summation-order bound "
                           f"{bound:.3e} (gamma_{longest_sum} x max|b| x {step + 1} steps)")
    return BUG, (f"max |a - b| = {max_abs:.3e} is past the summation-order bound {bound:.3e} "
                 "and both layouts round alike")
