"""The search: every layout of the space, scored, the best first, the rest accounted for.

    plan(model, cluster, gpus, setup) -> Plan
        .best        feasible layouts, fastest step first (ties: less memory)
        .excluded    {reason: count}: why every other layout was left out
        .nearest     when nothing fits: the layout that misses by the least memory,
                     with what it lacks
        .evaluated   how many layouts were looked at (the whole space, no sampling)

A layout is excluded by the first rule it breaks (``layouts.violations``), or for
memory: its fullest stage needs more than the GPU holds.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from minidist.calc.planner import layouts as space
from minidist.calc.planner.layouts import Layout
from minidist.calc.planner.memory import MemoryBreakdown, memory_per_gpu
from minidist.calc.planner.presets import ClusterSpec, ModelSpec, TrainingSetup
from minidist.calc.planner.time import TimeBreakdown, mfu, step_time


@dataclass(frozen=True)
class Scored:
    layout: Layout
    memory: MemoryBreakdown
    time: TimeBreakdown
    mfu: float                          # model FLOPs / (step x GPUs x peak)
    hfu: float                          # the same with recomputed FLOPs counted
    reasons: tuple[str, ...] = ()       # empty: feasible

    @property
    def feasible(self) -> bool:
        return not self.reasons


@dataclass
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    gpus: int
    setup: TrainingSetup
    best: list[Scored] = field(default_factory=list)
    excluded: Counter = field(default_factory=Counter)
    nearest: Scored | None = None
    evaluated: int = 0
    points: list[tuple[float, float, bool]] = field(default_factory=list)  # (mem, time, ok)


def score(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
          gpus: int | None = None) -> Scored:
    """Memory, time and MFU of one layout, with every reason it cannot run (if any)."""
    gpus = layout.gpus if gpus is None else gpus
    reasons = space.violations(spec, setup, layout, gpus, cluster.gpus_per_node)
    if reasons:             # a rule broken: the cost formulas do not apply
        return Scored(layout, None, None, 0.0, 0.0, tuple(reasons))
    memory = memory_per_gpu(spec, setup, layout)
    time = step_time(spec, setup, layout, cluster)
    if memory.total > cluster.memory:
        reasons.append(f"out of memory: needs {memory.total / 1e9:.1f} GB of "
                       f"{cluster.memory / 1e9:.0f} GB ({(memory.total - cluster.memory) / 1e9:.1f}"
                       " GB over)")
    return Scored(layout, memory, time, mfu(spec, setup, layout, cluster, time.total),
                  mfu(spec, setup, layout, cluster, time.total, hardware=True), tuple(reasons))


def _category(reason: str) -> str:
    """The rule a reason names, without its numbers, for counting."""
    for key, label in (("not the", "GPU count"), ("heads", "heads % tp"),
                       ("spans nodes", "tp beyond a node"), ("layers nor", "layers % pp"),
                       ("> ", "pp > layers"), ("pp x v", "layers % (pp v)"),
                       ("2 cp", "seq % 2cp"), ("experts", "experts % ep"),
                       ("sequences", "batch % (dp b)"), ("zb_h1", "zb_h1: m < p"),
                       ("interleaved needs", "m % pp (interleaved)"),
                       ("out of memory", "out of memory")):
        if key in reason:
            return label
    return reason


def plan(spec: ModelSpec, cluster: ClusterSpec, gpus: int, setup: TrainingSetup, *,
         top: int = 10, max_micro_batch: int = 8, keep_points: bool = False) -> Plan:
    """Search the whole space of layouts of ``gpus`` GPUs (module docstring)."""
    if gpus < 1:
        raise ValueError(f"need at least one GPU, got {gpus}")
    if setup.global_batch_tokens < setup.seq or setup.global_batch_tokens % setup.seq:
        raise ValueError(f"the global batch ({setup.global_batch_tokens} tokens) must be a "
                         f"whole number of sequences of {setup.seq} tokens")
    result = Plan(spec, cluster, gpus, setup)
    feasible: list[Scored] = []
    for layout in space.enumerate_layouts(spec, setup, gpus, cluster.gpus_per_node,
                                          max_micro_batch):
        result.evaluated += 1
        reasons = space.violations(spec, setup, layout, gpus, cluster.gpus_per_node)
        if reasons:
            result.excluded[_category(reasons[0])] += 1
            continue
        scored = score(spec, setup, layout, cluster, gpus)
        if keep_points:
            result.points.append((scored.memory.total, scored.time.total, scored.feasible))
        if scored.feasible:
            feasible.append(scored)
        else:
            result.excluded["out of memory"] += 1
            if result.nearest is None or scored.memory.total < result.nearest.memory.total:
                result.nearest = scored
    feasible.sort(key=lambda s: (s.time.total, s.memory.total))
    result.best = feasible[:top]
    if result.best:
        result.nearest = None
    return result
