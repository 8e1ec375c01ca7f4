"""What the overlapped variants leave exposed: the planner's price of hiding communication.

time.py prices every collective of model parallelism as exposed (on the critical
path). Each overlap below hides part of one term behind compute, and each is one
function with its formula; ``overlapped_step_time`` puts them into a layout's
``TimeBreakdown`` in place of the plain terms (time.py is unchanged).

    async TP       collective matmul (Wang et al. 2023): the ring's N - 1 transfers,
                   T_comm / (N - 1) each, overlap a matmul on the chunk already there,
                   T_mm / N each; the first chunk is local:
                       exposed = (N - 1) max(0, T_comm / (N - 1) - T_mm / N)
                   (the same for one collective or k of them splitting T_comm and T_mm
                   evenly), per layer and micro-batch, T_mm that pass's compute
    DualPipeV      per rank, 2m - 2p - 1 of its 2m chunk passes run as F&B pairs (the
                   least busy rank; pipeline/dualpipe.py's phases 4 and 5), in which
                   each half's all-to-alls hide behind the other half's compute:
                       F&B = F + B + max(0, a_F - B) + max(0, a_B - F)
                   a_F, a_B a chunk pass's forward and backward all-to-alls; the bubble
                   is calc.dualpipe_v_exact_idle(p, F + a_F, B + a_B, W, F&B)
    dispatch       parallel/expert: the forward dispatch all-to-all a in flight while
                   the shared experts compute (s): per MoE layer and micro-batch
                       exposed = 3 a + max(0, a - s)      (plain: 4 a)
    gathers        FSDP / ZeRO-3 all-gathers the parameters twice (forward, backward)
                   and reduce-scatters the gradients once: 2 g + r bytes, the plain
                   1.5 x of an all-reduce of r (time.ZERO3_DP_FACTOR) becomes
                       (2 g / r + 1) / 2       g: bytes per gathered parameter
                   (bf16 from float32: g / r = 1/2 -> 1.0; float8 + a scale: about 1/4 -> 0.75)

Tests: tests/calc/planner/test_overlap.py; docs/planner.md, "Overlapped variants".
"""
from __future__ import annotations

from dataclasses import replace

from minidist.calc import pipeline, tensor
from minidist.calc.planner import model, time
from minidist.calc.planner.layouts import Layout, microbatches, stage_layers
from minidist.calc.planner.presets import ClusterSpec, ModelSpec, TrainingSetup


def collective_matmul_exposed(comm: float, matmul: float, ranks: int) -> float:
    """(N - 1) max(0, T_comm / (N - 1) - T_mm / N): async TP's exposed time."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * max(0.0, comm / (ranks - 1) - matmul / ranks)


def fb_pair_seconds(forward: float, backward: float, comm_forward: float,
                    comm_backward: float) -> float:
    """F&B = F + B + max(0, a_F - B) + max(0, a_B - F): one F&B op with each half's
    all-to-alls hidden behind the other half's compute."""
    return (forward + backward + max(0.0, comm_forward - backward)
            + max(0.0, comm_backward - forward))


def dualpipe_v_seconds(compute: float, ep_comm: float, stages: int,
                       m: int) -> tuple[float, float]:
    """(bubble, exposed all-to-all) of a DualPipeV stage whose 2m chunk passes take
    ``compute`` in all (F one third of a pass, B two, W half of B) and move
    ``ep_comm`` of all-to-alls (half forward, half backward); module docstring."""
    passes = 2 * m
    f = compute / passes / 3
    b = 2 * f
    a = ep_comm / passes / 2                       # one half's all-to-alls
    pair = fb_pair_seconds(f, b, a, a)
    pairs = max(0, 2 * m - 2 * stages - 1)         # F&B ops of the least busy rank
    hidden = pairs * (f + b + 2 * a - pair)        # what each pair took off its plain ops
    bubble = pipeline.dualpipe_v_exact_idle(stages, f + a, b + a, b / 2, pair)
    return bubble, ep_comm - hidden


def overlapped_dispatch_exposed(all_to_all: float, shared: float) -> float:
    """3 a + max(0, a - s) of a layer pass's four all-to-alls of ``all_to_all`` each."""
    return 3 * all_to_all + max(0.0, all_to_all - shared)


def gathered_dp_factor(gather_bytes: float, grad_bytes: float) -> float:
    """(2 g / r + 1) / 2: ZeRO-3's traffic against one all-reduce of the gradients."""
    return (2 * gather_bytes / grad_bytes + 1) / 2


def overlapped_step_time(spec: ModelSpec, setup: TrainingSetup, layout: Layout,
                         cluster: ClusterSpec, *, async_tp: bool = False,
                         dualpipe_v: bool = False, overlapped_dispatch: bool = False,
                         gather_bytes: float | None = None) -> time.TimeBreakdown:
    """``time.step_time`` with the chosen overlaps priced (module docstring).
    ``dualpipe_v`` needs pp > 1 and m >= 2 pp; ``gather_bytes`` (bytes per gathered
    parameter) applies to ZeRO-3."""
    plain = time.step_time(spec, setup, layout, cluster)
    m = microbatches(layout, setup)
    layers = max(stage_layers(spec, layout))
    width = 2 if setup.precision == "mixed" else 4
    per_pass = plain.compute / (layers * m)        # one layer, one micro-batch, F + B
    out = plain
    if async_tp and layout.tp > 1:
        out = replace(out, tp=layers * m * collective_matmul_exposed(
            plain.tp / (layers * m), per_pass, layout.tp))
    if overlapped_dispatch and spec.moe and spec.shared_experts and layout.ep > 1:
        a = plain.ep / (layers * m) / time.EP_PASSES
        share = _shared_share(spec)
        out = replace(out, ep=layers * m * overlapped_dispatch_exposed(a, per_pass / 3 * share))
    if dualpipe_v:
        if layout.pp < 2 or m < 2 * layout.pp:
            raise ValueError(f"DualPipeV needs pp >= 2 and m >= 2 pp micro-batches, got "
                             f"pp = {layout.pp}, m = {m}")
        bubble, ep = dualpipe_v_seconds(plain.compute, out.ep, layout.pp, m)
        out = replace(out, bubble=bubble, ep=ep)
    if dualpipe_v:                                  # two chunks per rank: twice the sends
        out = replace(out, pp=plain.pp * 2 / layout.virtual_stages)
    if gather_bytes is not None and layout.zero == 3:
        factor = gathered_dp_factor(gather_bytes, width)
        out = replace(out, dp=time.dp_seconds(spec, layout, cluster, layers, m, width,
                                              plain.compute, factor))
    return out


def _shared_share(spec: ModelSpec) -> float:
    """The shared experts' part of a token's matmul parameters in one layer."""
    width = spec.expert_ffn_hidden or spec.ffn_hidden
    shared = spec.shared_experts * tensor.ffn_params(spec.hidden, width, spec.gated)
    return shared / model.active_matmul_params_per_layer(spec)
