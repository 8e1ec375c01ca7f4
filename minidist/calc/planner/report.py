"""The planner's answer as text: the best layouts with their breakdown, the exclusions,
the nearest miss, and one layout explained term by term."""
from __future__ import annotations

from minidist.calc.planner.search import Plan, Scored

GB = 1e9
TIME_PARTS = ("compute", "bubble", "tp", "cp", "ep", "pp", "dp")
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "buffers")


def _s(seconds: float) -> str:
    return f"{seconds:8.3f}"


def table(result: Plan, rows: int = 10) -> list[str]:
    """The best ``rows`` layouts: step time and its parts, MFU, memory and its parts."""
    lines = [f"{'layout':<44} {'step s':>8} {'MFU':>6} {'mem GB':>7} | "
             + " ".join(f"{p:>8}" for p in TIME_PARTS) + " | "
             + " ".join(f"{p[:6]:>6}" for p in MEMORY_PARTS)]
    for scored in result.best[:rows]:
        t, m = scored.time, scored.memory
        lines.append(f"{scored.layout.short():<44} {_s(t.total)} {scored.mfu:6.1%} "
                     f"{m.total / GB:7.1f} | "
                     + " ".join(_s(getattr(t, p)) for p in TIME_PARTS) + " | "
                     + " ".join(f"{getattr(m, p) / GB:6.1f}" for p in MEMORY_PARTS))
    return lines


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
        lines.append(f"    {part:<8} {value:9.4f} s  {value / t.total:6.1%}   {sources[part]}")
    lines.append(f"  memory per GPU {m.total / GB:.2f} GB (fullest stage):")
    for part in MEMORY_PARTS:
        value = getattr(m, part)
        lines.append(f"    {part:<12} {value / GB:9.3f} GB")
    return lines


def published(comparisons: list) -> list[str]:
    """Each published layout: reported vs predicted utilization, and the planner's best."""
    lines = [f"{'model':<14} {'GPUs':>6} {'published layout':<40} {'reported':>8} "
             f"{'predicted':>9} {'mem GB':>6}  {'planner best':<44} {'its MFU':>7} "
             f"{'speed-up':>8}"]
    for c in comparisons:
        kind = "HFU" if c.entry.counts_recompute else "MFU"
        lines.append(f"{c.entry.model:<14} {c.entry.gpus:>6} {c.published.layout.short():<40} "
                     f"{c.entry.utilization:>4.0%} {kind} {c.predicted:>9.1%} "
                     f"{c.published.memory.total / GB:6.1f}  {c.best.layout.short():<44} "
                     f"{c.best.mfu:7.1%} {c.speed_ratio:7.2f}x")
    return lines
