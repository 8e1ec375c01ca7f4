"""Memory per GPU against step time for every layout the search scored, the best marked."""
from __future__ import annotations

from minidist.calc.planner.search import Plan


def draw(result: Plan, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for ok, colour, label in ((False, "#d0d0d0", "does not fit"), (True, "#4477aa", "fits")):
        points = [(t, m / 1e9) for m, t, fits in result.points if fits == ok]
        if points:
            ax.scatter(*zip(*points), s=6, c=colour, label=label, linewidths=0)
    best = result.best[0]
    ax.scatter([best.time.total], [best.memory.total / 1e9], s=80, marker="*", c="#cc3311",
               label=f"best: {best.layout.short()}", zorder=3)
    ax.axhline(result.cluster.memory / 1e9, color="black", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_title(f"{result.model.name} on {result.gpus} GPUs: every layout")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
