"""The timeline of a trace as a figure (matplotlib), one row per thread of each rank.

    minidist trace plot run.json run.png [--start MS] [--end MS]

Spans are bars coloured by what they are (communication, module forward,
pipeline F / B / W, optimizer, DDP bucket, ZeRO, MoE dispatch, checkpoint); a span inside
another is drawn thinner on top of it, so the nesting shows. Messages are thin
grey lines from the send to the receive; failures are red lines across the
figure. Perfetto shows the same with zoom and search; this is for a page.
"""
from __future__ import annotations

from collections import defaultdict

COLOURS = {"comm": "#d62728", "module": "#1f77b4", "optim": "#7f7f7f", "ddp": "#8c564b",
           "zero": "#17becf", "moe": "#bcbd22", "checkpoint": "#000000", "failure": "#d62728"}
PIPELINE = {"F": "#2ca02c", "B": "#ff7f0e", "W": "#9467bd"}
LEGEND = (("communication", COLOURS["comm"]), ("module forward", COLOURS["module"]),
          ("pipeline F", PIPELINE["F"]), ("pipeline B", PIPELINE["B"]),
          ("pipeline W", PIPELINE["W"]), ("optimizer", COLOURS["optim"]),
          ("DDP bucket", COLOURS["ddp"]), ("ZeRO", COLOURS["zero"]),
          ("MoE dispatch", COLOURS["moe"]))
MAX_FLOWS = 400   # arrows drawn at most (a long run has many thousands)


def _depths(spans: list[dict]) -> list[int]:
    """Each span's depth in the nesting of its thread (0: outermost)."""
    order = sorted(range(len(spans)), key=lambda k: (spans[k]["ts"], -spans[k]["dur"]))
    depth, stack = [0] * len(spans), []
    for k in order:
        start = spans[k]["ts"]
        while stack and stack[-1] <= start:
            stack.pop()
        depth[k] = len(stack)
        stack.append(start + spans[k]["dur"])
    return depth


def _colour(e: dict) -> str:
    if e["cat"] == "pipeline":
        return PIPELINE.get(e["name"][:1], "#2ca02c")
    return COLOURS.get(e["cat"], "#bcbd22")


def plot(trace: dict, out: str, start_ms: float | None = None, end_ms: float | None = None,
         title: str | None = None) -> str:
    """Draw ``trace`` into the image ``out`` (any matplotlib format); returns ``out``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise SystemExit("minidist trace plot needs matplotlib: pip install -e '.[plot]'") from None
    events = trace["traceEvents"]
    lo = -float("inf") if start_ms is None else start_ms * 1e3
    hi = float("inf") if end_ms is None else end_ms * 1e3
    procs = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    rows = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e["ts"] + e["dur"] >= lo and e["ts"] <= hi:
            rows[(e["pid"], e["tid"])].append(e)
    keys = sorted(rows)
    if not keys:
        raise ValueError("the trace has no spans in that window")
    row_of = {key: k for k, key in enumerate(keys)}
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(keys) + 1.6))
    for key, spans in rows.items():
        _spans(ax, spans, row_of[key])
    _flows(ax, events, row_of, lo, hi)
    for e in events:
        if e.get("ph") == "i" and e.get("cat") == "failure" and lo <= e["ts"] <= hi:
            ax.axvline(e["ts"] / 1e3, color=COLOURS["failure"], lw=1.5)
            ax.text(e["ts"] / 1e3, -0.9, e["name"][:60], color=COLOURS["failure"], fontsize=7)
    labels = [f"{procs.get(pid, pid)}: {threads.get((pid, tid), tid)}"[:60] for pid, tid in keys]
    ax.set_yticks(range(len(keys)), labels, fontsize=7)
    ax.set_ylim(len(keys) - 0.4, -1.2)
    ax.set_xlabel("ms")
    legend = [Patch(color=c, label=n) for n, c in LEGEND]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(keys)),
              ncol=5, fontsize=7, frameon=False)
    ax.set_title(title or "every rank, one clock (grey lines: messages, send to receive)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def _spans(ax, spans: list[dict], y: int) -> None:
    """One thread's spans as bars in row ``y``, a nested span thinner on top of its parent."""
    depths = _depths(spans)
    for d, e in sorted(zip(depths, spans), key=lambda pair: pair[0]):   # outer ones first
        h = max(0.8 - 0.2 * d, 0.15)
        ax.broken_barh([(e["ts"] / 1e3, e["dur"] / 1e3)], (y - h / 2, h),
                       facecolors=_colour(e), edgecolor="none", alpha=0.9)
        if e["cat"] == "pipeline" and d == 0:
            ax.text((e["ts"] + e["dur"] / 2) / 1e3, y, e["name"], ha="center",
                    va="center", fontsize=6, color="white", clip_on=True)


def _flows(ax, events: list[dict], row_of: dict, lo: float, hi: float) -> None:
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    drawn = 0
    for e in events:
        if e.get("ph") != "f" or e["id"] not in starts or drawn >= MAX_FLOWS:
            continue
        s = starts[e["id"]]
        a, b = (s["pid"], s["tid"]), (e["pid"], e["tid"])
        if a not in row_of or b not in row_of or not (lo <= s["ts"] <= hi):
            continue
        ax.plot([s["ts"] / 1e3, e["ts"] / 1e3], [row_of[a], row_of[b]], color="#555555",
                lw=0.4, alpha=0.5)
        drawn += 1
