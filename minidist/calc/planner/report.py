"""The planner's answer as text: the best layouts with their breakdown, the exclusions,
the nearest miss, and one layout explained term by term."""
from __future__ import annotations

import textwrap

from minidist.calc.planner.search import Plan, Scored

GB = 1e9
TIME_PARTS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp")
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "buffers")


WIDTH = 100     # every line of the planner's text fits a 100-column terminal
LEGEND = ("layout: dpN tpN ppN cpN epN, the data / tensor / pipeline / context / expert "
          "parallel degrees; zN, the ZeRO stage (0: DDP, 3: FSDP); bN, sequences per "
          "micro-batch; then activation recomputation (none | selective | full) and the "
          "pipeline schedule (none with one stage | 1f1b | interleaved-vV with V chunks "
          "per stage | zb_h1)")


def _s(seconds: float) -> str:
    return f"{seconds:8.3f}"


def wrapped(text: str, indent: str = "") -> list[str]:
    """``text`` cut into lines of WIDTH columns at spaces, continuation lines indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def table(result: Plan, rows: int = 10) -> list[str]:
    """The best ``rows`` layouts, numbered: step time, MFU and memory; then the step time's
    parts and the memory's parts of each, by number; then the legend of the layout codes."""
    best = result.best[:rows]
    lines = [f"{'#':>3}  {'layout':<52} {'step s':>8} {'MFU':>6} {'mem GB':>7}"]
    for i, scored in enumerate(best, 1):
        lines.append(f"{i:>3}  {scored.layout.short():<52} {_s(scored.time.total)} "
                     f"{scored.mfu:6.1%} {scored.memory.total / GB:7.1f}")
    lines += ["", "step time by part, s"]
    lines.append(f"{'#':>3}  " + " ".join(f"{p:>8}" for p in TIME_PARTS))
    for i, scored in enumerate(best, 1):
        lines.append(f"{i:>3}  " + " ".join(_s(getattr(scored.time, p)) for p in TIME_PARTS))
    lines += ["", "memory per GPU by part, GB"]
    lines.append(f"{'#':>3}  " + " ".join(f"{p:>11}" for p in MEMORY_PARTS))
    for i, scored in enumerate(best, 1):
        lines.append(f"{i:>3}  " + " ".join(f"{getattr(scored.memory, p) / GB:11.1f}"
                                           for p in MEMORY_PARTS))
    return lines + [""] + wrapped(LEGEND, "  ")


def exclusions(result: Plan) -> list[str]:
    total = sum(result.excluded.values())
    lines = [f"{result.evaluated:,} layouts searched, {len(result.best)} shown, "
             f"{total:,} excluded:"]
    for reason, count in result.excluded.most_common():
        lines.append(f"  {count:>9,}  {reason}")
    return lines


def nearest_miss(result: Plan) -> list[str]:
    """Why nothing fits: the layout closest to fitting and what it lacks."""
    if result.nearest is not None:
        near = result.nearest
        return [f"no layout fits. Nearest miss: {near.layout.short()}",
                *(f"  {reason}" for reason in near.reasons)]
    if result.excluded:
        reason, count = result.excluded.most_common(1)[0]
        return [f"no layout of {result.gpus} GPUs passes the divisibility rules; the most "
                f"common reason ({count:,} layouts): {reason}"]
    return ["no layout to search"]


def explain(scored: Scored, result_model_name: str = "") -> list[str]:
    """One layout term by term: each time and memory part with the formula it comes from."""
    lay = scored.layout
    lines = [f"layout {lay.short()}" + (f"  ({result_model_name})" if result_model_name else ""),
             f"  GPUs: dp {lay.dp} x tp {lay.tp} x pp {lay.pp} x cp {lay.cp} = {lay.gpus}"
             f"{f', ep {lay.ep} inside dp x cp' if lay.ep > 1 else ''}"]
    if scored.reasons:
        lines.append("  cannot run:")
        lines += [f"    {reason}" for reason in scored.reasons]
    if scored.time is None:
        return lines
    t, m = scored.time, scored.memory
    sources = {
        "compute": "hardware FLOPs x stage share / (GPUs x peak x efficiency)",
        "bubble": "compute x calc.pipeline.bubble_fraction(p, m, schedule, v)",
        "tp": "(4 or 6) x layers x m x ring all-reduce of b s h 2 bytes over tp (NVLink)",
        "cp": "(2 or 3) x layers x m x all-gather of K and V over cp",
        "ep": "4 x MoE layers x m x all-to-all of b s k h 2 bytes x (ep-1)/ep",
        "pp": "2 m v sends of b s h / tp x 2 bytes across a stage boundary",
        "dp": "calc.comm.exposed_comm_seconds(layers, one layer's all-reduce, backward/layer)",
    }
    lines.append(f"  step time {t.total:.3f} s, MFU {scored.mfu:.1%} (HFU {scored.hfu:.1%}):")
    for part in TIME_PARTS:
        value = getattr(t, part)
        lines += wrapped(f"    {part:<8} {value:9.4f} s  {value / t.total:6.1%}   {sources[part]}",
                         " " * 37)
    lines.append(f"  memory per GPU {m.total / GB:.2f} GB (fullest stage):")
    for part in MEMORY_PARTS:
        value = getattr(m, part)
        lines.append(f"    {part:<12} {value / GB:9.3f} GB")
    return lines


def published(comparisons: list) -> list[str]:
    """Each published layout: reported vs predicted utilization; then the planner's best for
    the same model and GPUs, and how much faster it predicts it to be."""
    lines = [f"{'model':<14} {'GPUs':>5}  {'published layout':<48} {'reported':>8} "
             f"{'predicted':>9} {'mem GB':>6}"]
    for c in comparisons:
        kind = "HFU" if c.entry.counts_recompute else "MFU"
        lines.append(f"{c.entry.model:<14} {c.entry.gpus:>5}  {c.published.layout.short():<48} "
                     f"{c.entry.utilization:>4.0%} {kind} {c.predicted:>9.1%} "
                     f"{c.published.memory.total / GB:6.1f}")
    lines += ["", f"{'model':<14} {'planner best':<52} {'its MFU':>7} {'speed-up':>8}"]
    for c in comparisons:
        lines.append(f"{c.entry.model:<14} {c.best.layout.short():<52} {c.best.mfu:7.1%} "
                     f"{c.speed_ratio:7.2f}x")
    return lines + [""] + wrapped(LEGEND, "  ")
