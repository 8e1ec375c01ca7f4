"""Layouts published for real models, with the throughput their authors measured.

Each entry: the model preset, the cluster, the GPU count, the batch, the layout the
authors ran and what they reported. ``compare(entry)`` scores the published layout
with the planner's cost model and searches for the planner's own best, so that a
reader sees both the model's error on a real run and how far its choice is from
the authors'.

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM"), Table 1: A100 80 GB (312 TFLOP/s BF16), s = 2048, full activation
recomputation, the interleaved schedule; achieved TFLOP/s per GPU and % of peak:

    145.6B  tp 8  pp 8   1536 GPUs  batch 2304  148 TFLOP/s  47%
    310.1B  tp 8  pp 16  1920 GPUs  batch 2160  155 TFLOP/s  50%
    1008B   tp 8  pp 64  3072 GPUs  batch 3072  163 TFLOP/s  52%

Dubey et al. 2024 ("The Llama 3 Herd of Models"), Table 4: H100 80 GB (989 TFLOP/s),
s = 8192, 16M tokens per batch, BF16 MFU:

    405B    tp 8  cp 1  pp 16  dp 64   8192 GPUs   430 TFLOP/s  43%
    405B    tp 8  cp 1  pp 16  dp 128  16384 GPUs  400 TFLOP/s  41%

Megatron's figures count the recomputed forward (eq. 3 with recomputation: a hardware
FLOPs utilization), Llama 3's do not (MFU); ``Comparison.predicted`` is the planner's
figure of the same kind. Megatron ran ZeRO-less data parallelism (stage 0). Llama 3 ran
the interleaved schedule with FSDP-style sharding and does not give in its table how much
it sharded, recomputed, or how many chunks each stage held: the comparison takes the
fastest choice of the three that fits in memory. Megatron's chunks per stage are not in its Table 1
either; its rows take v = 2.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from minidist.calc.planner.layouts import RECOMPUTE, ZERO_STAGES, Layout
from minidist.calc.planner.presets import TrainingSetup, cluster_preset, model_preset
from minidist.calc.planner.search import Scored, plan, score


@dataclass(frozen=True)
class Published:
    source: str
    model: str
    cluster: str
    gpus: int
    setup: TrainingSetup
    layout: Layout                 # zero / recompute None, v 0: not reported
    utilization: float             # reported fraction of peak
    counts_recompute: bool         # the report counts recomputed FLOPs (HFU) or not (MFU)


PUBLISHED = (
    Published("Narayanan et al. 2021, Table 1", "megatron-145b", "a100-nvlink-ib", 1536,
              TrainingSetup(2304 * 2048, 2048),
              Layout(24, 8, 8, zero=0, recompute="full", schedule="interleaved",
                     virtual_stages=2), 0.47, True),
    Published("Narayanan et al. 2021, Table 1", "megatron-310b", "a100-nvlink-ib", 1920,
              TrainingSetup(2160 * 2048, 2048),
              Layout(15, 8, 16, zero=0, recompute="full", schedule="interleaved",
                     virtual_stages=2), 0.50, True),
    Published("Narayanan et al. 2021, Table 1", "megatron-1t", "a100-nvlink-ib", 3072,
              TrainingSetup(3072 * 2048, 2048),
              Layout(6, 8, 64, zero=0, recompute="full", schedule="interleaved",
                     virtual_stages=2), 0.52, True),
    Published("Dubey et al. 2024, Table 4", "llama3-405b", "h100-nvlink-ib", 8192,
              TrainingSetup(16 * 2**20, 8192),
              Layout(64, 8, 16, zero=None, recompute=None, schedule="interleaved",
                     virtual_stages=0), 0.43, False),
    Published("Dubey et al. 2024, Table 4", "llama3-405b", "h100-nvlink-ib", 16384,
              TrainingSetup(16 * 2**20, 8192),
              Layout(128, 8, 16, zero=None, recompute=None, schedule="interleaved",
                     virtual_stages=0), 0.41, False),
)


@dataclass(frozen=True)
class Comparison:
    entry: Published
    published: Scored          # the authors' layout under the planner's cost model
    best: Scored               # the planner's own choice

    @property
    def predicted(self) -> float:
        """The planner's utilization of the published layout, counted as the report does."""
        return self.published.hfu if self.entry.counts_recompute else self.published.mfu

    @property
    def speed_ratio(self) -> float:
        """Predicted step time of the published layout / of the planner's best (>= 1)."""
        return self.published.time.total / self.best.time.total


def compare(entry: Published) -> Comparison:
    spec, cluster = model_preset(entry.model), cluster_preset(entry.cluster)
    found = plan(spec, cluster, entry.gpus, entry.setup, top=1)
    if not found.best:
        raise ValueError(f"no layout of {entry.model} fits {entry.gpus} GPUs")
    return Comparison(entry, published_layout(entry), found.best[0])


def published_layout(entry: Published) -> Scored:
    """The published layout scored; what the report leaves out (zero or recompute None,
    v 0) is filled with the fastest choice that fits (the fastest of all when none fits)."""
    spec, cluster = model_preset(entry.model), cluster_preset(entry.cluster)
    layout = entry.layout
    recomputes = (layout.recompute,) if layout.recompute else RECOMPUTE
    chunks = (layout.virtual_stages,) if layout.virtual_stages else range(1, spec.layers + 1)
    stages = (layout.zero,) if layout.zero is not None else ZERO_STAGES
    best = None
    for zero, recompute, v in itertools.product(stages, recomputes, chunks):
        candidate = replace(layout, zero=zero, recompute=recompute, virtual_stages=v,
                            schedule=layout.schedule if v > 1 else "1f1b")
        scored = score(spec, entry.setup, candidate, cluster)
        if scored.time is None:
            continue
        if best is None or (scored.feasible, -scored.time.total) > \
                (best.feasible, -best.time.total):
            best = scored
    return best
