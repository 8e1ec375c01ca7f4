"""Diagnostics for data-parallel runs (source documents, exercise 35.23).

Three questions to ask a run whose numbers look wrong:

(a) **Do the ranks agree on the gradient?** Each rank's gradient norm
    ||g_r|| = sqrt(sum_i g_r,i^2) is gathered to every rank. Before the
    gradient all-reduce the norms differ (each rank saw its own data); after
    it they must be bitwise equal. A rank whose norm differs after the sync
    skipped it, or synced with the wrong group.
(b) **Do the ranks report the same loss?** The loss each rank logs should be
    the same number: the mean over ranks, all-reduced. ``check_loss_sync``
    gathers the values and says whether they are equal to the last bit.
(c) **Where does the step's time go?** Every collective records how long it
    took (``group.stats``). ``comm_breakdown`` turns that into a table: calls,
    bytes, seconds and share of the step per collective, and the rest, compute.

All three cost O(1) data per rank per step (one number each), so they can run
every step of a real job. ``Diagnostics`` keeps the rows and prints the tables
at the end (demo: ``demos/13_diagnostics.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from minidist import backend
from minidist.backend import xp
from minidist.comm import all_gather
from minidist.comm.group import ProcessGroup, get_rank, get_stats, get_world_size
from minidist.optim.clip import grad_sq_sum


def gather_scalar(value: float, group: ProcessGroup | None = None) -> list[float]:
    """Every rank's ``value``, in rank order, on every rank (one float64 each)."""
    mine = xp.asarray([float(value)], dtype="float64")
    slots = [xp.zeros(1, dtype="float64") for _ in range(get_world_size(group))]
    all_gather(slots, mine, group=group)
    return [float(backend.to_host(s)[0]) for s in slots]


def grad_norms_per_rank(params: Iterable[Any], group: ProcessGroup | None = None) -> list[float]:
    """||g_r|| of this rank's gradients, gathered from every rank."""
    return gather_scalar(math.sqrt(grad_sq_sum(list(params))), group)


@dataclass
class LossSync:
    values: list[float]                   # the loss each rank reports, in rank order

    @property
    def in_sync(self) -> bool:
        """True if every rank reports the same loss, to the last bit."""
        return all(v == self.values[0] for v in self.values)

    @property
    def spread(self) -> float:
        return max(self.values) - min(self.values)


def check_loss_sync(loss: float, group: ProcessGroup | None = None) -> LossSync:
    """Gather the loss every rank is about to log and compare them."""
    return LossSync(gather_scalar(loss, group))


def comm_breakdown(step_seconds: float, group: ProcessGroup | None = None) -> list[tuple]:
    """Rows (name, calls, MB sent, seconds, share of the step) per collective, then
    ``compute`` for what is left. ``step_seconds`` is the wall time the stats cover."""
    rows = []
    comm_total = 0.0
    for name, s in sorted(get_stats(group).per_collective.items()):
        comm_total += s["seconds"]
        rows.append((name, s["calls"], s["bytes_sent"] / 1e6, s["seconds"],
                     s["seconds"] / step_seconds if step_seconds else 0.0))
    compute = max(step_seconds - comm_total, 0.0)
    rows.append(("compute (the rest)", "", "", compute,
                 compute / step_seconds if step_seconds else 0.0))
    return rows


@dataclass
class Diagnostics:
    """Collects (a) and (b) each step; prints them and (c) as tables at the end."""
    group: Any = None
    rows: list = field(default_factory=list)  # (step, norms before, norms after, LossSync)

    def record(self, step: int, norms_before: list[float], norms_after: list[float],
               loss: LossSync) -> None:
        self.rows.append((step, norms_before, norms_after, loss))

    def problems(self) -> list[str]:
        """What looks wrong: ranks whose synced gradient or logged loss differs."""
        found = []
        for step, _, after, loss in self.rows:
            odd = [r for r, n in enumerate(after) if n != after[0]]
            if odd:
                found.append(f"step {step}: gradient norms differ after sync on ranks {odd}")
            if not loss.in_sync:
                found.append(f"step {step}: logged losses differ (spread {loss.spread:.3e})")
        return found

    def report(self, step_seconds: float) -> str:
        lines = ["gradient norm per rank (before sync -> after sync; * = differs from "
                 "rank 0 after sync), logged loss in sync?"]
        for step, before, after, loss in self.rows:
            b = " ".join(f"{n:8.4f}" for n in before)
            a = " ".join(f"{n:8.4f}{'*' if n != after[0] else ' '}" for n in after)
            lines.append(f"  step {step:3d}: [{b}] -> [{a}]  loss {'yes' if loss.in_sync else 'NO'}")
        lines.append(f"communication vs compute on rank {get_rank(self.group)} "
                     f"({step_seconds:.3f} s in all):")
        lines.append(f"  {'':<20} {'calls':>6} {'MB sent':>9} {'seconds':>9} {'share':>7}")
        for name, calls, mb, secs, share in comm_breakdown(step_seconds, self.group):
            mb_text = f"{mb:9.2f}" if mb != "" else " " * 9
            lines.append(f"  {name:<20} {calls!s:>6} {mb_text} {secs:9.4f} {100 * share:6.1f}%")
        return "\n".join(lines)
