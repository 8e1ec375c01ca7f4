"""Which layout for this model on these GPUs? A search of every parallel layout.

For a model (a preset such as ``llama3-70b`` or raw sizes), a cluster (GPUs per node,
memory, peak FLOP/s, NVLink and network speeds) and a batch, the planner enumerates
every dp x tp x pp x cp (x ep) layout with every ZeRO stage, micro-batch, recomputation
policy and pipeline schedule, prices each with the closed-form models of ``minidist.calc``
(memory per GPU part by part, step time term by term), drops those that break a rule or
do not fit, and ranks the rest by step time. See docs/planner.md; the command is
``minidist plan``.

Files, in reading order:

    presets.py    ModelSpec, ClusterSpec, TrainingSetup and the published presets
    model.py      parameters, FLOPs per token and activations of a (GQA, SwiGLU, MoE) model
    layouts.py    the Layout, the space of them, and the divisibility rules
    memory.py     memory per GPU of a layout: states by ZeRO stage, activations in flight
    time.py       step time of a layout: compute, bubble, exposed TP / CP / EP / PP / DP
    overlap.py    what async TP, DualPipeV, overlapped dispatch and low-precision gathers hide
    calibration.py  minidist's own GPT as measured here, where it departs from those models
    search.py     plan(): score every layout, rank, count the exclusions, the nearest miss
    report.py     the answer as text: the table, the exclusions, one layout explained
    published.py  Megatron's and Llama 3's published layouts against the planner's choice
    figure.py     memory against step time for the whole space
    machine.py    this machine as a cluster, its runnable layouts, predicted vs measured
    command.py    ``minidist plan``

Tests: tests/calc/planner/.
"""
from minidist.calc.planner.layouts import Layout, parse_layout
from minidist.calc.planner.presets import (CLUSTERS, MODELS, ClusterSpec, ModelSpec,
                                           TrainingSetup, cluster_preset, model_preset)
from minidist.calc.planner.search import Plan, Scored, plan, score

__all__ = ["CLUSTERS", "MODELS", "ClusterSpec", "Layout", "ModelSpec", "Plan", "Scored",
           "TrainingSetup", "cluster_preset", "model_preset", "parse_layout", "plan", "score"]
