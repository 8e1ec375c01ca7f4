"""compare(spec, a, b): train one model under two layouts and say where they part.

    report = compare(spec, parse_layout("dp=2 tp=2"), parse_layout("single"))
    report.steps[k]      # StepLine: both losses and their distance in ulps
    report.parting       # the first loss / gradient / parameter past the tolerance, or None

Per step the order is: the loss, then each gradient as the optimizer uses it
(module path order), then each parameter after the step; the first tensor whose
difference passes the tolerance is named, on the rank of layout a holding the
largest difference, with the cause diff.py tells. Layout b is the reference
(``single`` for one process).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
import numpy as np

from minidist.parallel.compare.diff import (Parting, Tolerance, classify, past,
                                            pieces_against_dense, scatter, ulps)
from minidist.parallel.compare.layout import Layout
from minidist.parallel.compare.run import (Plant, RunSpec, model_config, run_layout,
                                           sharding_on_rank)


@dataclass
class StepLine:
    step: int
    loss_a: float
    loss_b: float
    ulps: int                 # |ord(loss_a) - ord(loss_b)|


@dataclass
class Report:
    a: Layout
    b: Layout
    steps: list = field(default_factory=list)        # StepLine per step
    parting: Parting | None = None                   # None: equal within the tolerance


def _run(spec: RunSpec, layout: Layout, plant: Plant | None, worlds: dict) -> list:
    """Per rank, the list of StepRecords (the one process of ``single`` runs here)."""
    if layout.single:
        return [run_layout(spec, layout, plant)]
    return _on_ranks(layout, worlds, run_layout, spec, layout, plant)


def _on_ranks(layout: Layout, worlds: dict, fn: Any, *args: Any) -> list:
    """``fn(*args)`` on every rank of the layout's world (one of ``worlds``, or started)."""
    from minidist.comm import World
    n = layout.world_size
    own = n not in worlds
    world = World(n, timeout=30.0, run_timeout=300.0) if own else worlds[n]
    try:
        return world.run(fn, *args)
    finally:
        if own:
            world.close()


def show_sharding(spec: RunSpec, layout: Layout, name: str, worlds: dict | None = None) -> str:
    """visualize_sharding's table of parameter ``name`` under ``layout``: which ranks hold
    which block of it (parallel/compose/visualize.py)."""
    if layout.single:
        return f"{name}: one process holds it whole ('single')"
    return _on_ranks(layout, worlds or {}, sharding_on_rank, spec, layout, name)[0]


def _loss(ranks: list, step: int, dtype: str) -> float:
    """The whole batch's loss: the mean of the data shards' losses (the last stages')."""
    losses = [r[step].loss for r in ranks if r[step].loss is not None]
    return float(np.mean(np.array(losses, dtype=dtype)))


def _longest_sum(spec: RunSpec) -> int:
    idx = spec.batches[0][0]
    cfg = model_config(spec)
    return int(max(idx.size, 4 * cfg.dims().width, spec.vocab_size))


def _worst_piece(views_a: list, dense_b: dict, kind: str, tol: Tolerance) -> tuple | None:
    """(name, rank, max |a - b|, a, b) of the first name in module order with a piece past
    the tolerance, its worst piece; None if none is."""
    by_name: dict = {}
    for name, rank, got, want in pieces_against_dense(views_a, dense_b, kind):
        if past(got, want, tol):
            diff = float(np.max(np.abs(got - want)))
            by_name.setdefault(name, []).append((name, rank, diff, got, want))
    for name in dense_b:                      # module order
        if name in by_name:
            return max(by_name[name], key=lambda piece: piece[2])
    return None


def _absent_gradients_as_zeros(view: dict) -> dict:
    """The view with gradient 0 for each parameter piece that has none (frozen, or left out
    of a reduction), in module order: a gradient on one side only then parts at its step,
    unless it is 0 (an expert no token reached); without this it went unseen and the
    parameter it moved parted instead."""
    grads = {name: view["gradient"].get(name, (index, np.zeros_like(values)))
             for name, (index, values) in view["parameter"].items()}
    return {"gradient": grads, "parameter": view["parameter"]}


def _loss_parting(spec: RunSpec, a: Layout, b: Layout, line: StepLine,
                  tol: Tolerance) -> Parting | None:
    """The step's loss if it is past the tolerance (a loss scaled or averaged wrongly:
    its gradients part too, but later in the order; a loss reported wrongly parts here
    alone), else None."""
    la, lb = (np.array([v], spec.dtype) for v in (line.loss_a, line.loss_b))
    if not past(la, lb, tol):
        return None
    diff = float(abs(la[0] - lb[0]))
    cause, why = classify(diff, float(abs(lb[0])), line.step, _longest_sum(spec), spec.dtype,
                          (a.amp, b.amp))
    return Parting(line.step, "loss", "", None, diff, line.ulps, cause, why)


def _first_parting(spec: RunSpec, a: Layout, b: Layout, step: int, views_a: list,
                   views_b: list, tol: Tolerance) -> Parting | None:
    """The first gradient, then parameter, past the tolerance at this step."""
    views_a = [_absent_gradients_as_zeros(v) for v in views_a]
    views_b = [_absent_gradients_as_zeros(v) for v in views_b]
    for kind in ("gradient", "parameter"):
        dense_b = scatter(views_b, kind, _sizes(views_b, kind))
        worst = _worst_piece(views_a, dense_b, kind, tol)
        if worst is not None:
            name, rank, diff, got, want = worst
            cause, why = classify(diff, float(np.max(np.abs(want))), step, _longest_sum(spec),
                                  spec.dtype, (a.amp, b.amp))
            return Parting(step, kind, name, rank, diff, int(ulps(got, want).max()), cause, why)
    return None


def _sizes(views: list, kind: str) -> dict:
    """name -> dense size: a whole tensor's length, or one past the largest index seen."""
    sizes: dict = {}
    for view in views:
        for name, (index, values) in view[kind].items():
            size = values.size if index is None else int(index.max(initial=-1)) + 1
            sizes[name] = max(sizes.get(name, 0), size)
    return sizes


def compare(spec: RunSpec, a: Layout, b: Layout, tolerance: Tolerance | None = None,
            plant_a: Plant | None = None, plant_b: Plant | None = None,
            worlds: dict | None = None) -> Report:
    """Train under ``a`` and ``b`` from one seed on the same batches (module docstring).
    ``worlds``: started Worlds by size to reuse (tests); others are started and closed."""
    tol = tolerance or Tolerance()
    ranks_a = _run(spec, a, plant_a, worlds or {})
    ranks_b = _run(spec, b, plant_b, worlds or {})
    report = Report(a, b)
    for step in range(len(spec.batches)):
        la, lb = _loss(ranks_a, step, spec.dtype), _loss(ranks_b, step, spec.dtype)
        distance = int(ulps(np.array([la], spec.dtype), np.array([lb], spec.dtype))[0])
        report.steps.append(StepLine(step, la, lb, distance))
        if report.parting is not None:
            continue
        views = [[{"gradient": r[step].grads, "parameter": r[step].params} for r in ranks]
                 for ranks in (ranks_a, ranks_b)]
        report.parting = (_loss_parting(spec, a, b, report.steps[-1], tol)
                          or _first_parting(spec, a, b, step, views[0], views[1], tol))
    return report


def layouts_differ(report: Report) -> bool:
    """Whether the runs parted anywhere (the command's --assert-equal)."""
    return report.parting is not None

