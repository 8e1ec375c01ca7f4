"""ZeRO-3's gather timeline: did each unit's all-gather hide behind compute?

ZeRO-3 gathers a unit's weights just before the unit computes (zero3.py). With
``prefetch=True`` the gather of the next unit is posted, asynchronously, as
soon as the current unit has its weights, so it can travel while the current
unit computes. For every use of a unit in the last step, ``Zero3.gather_timeline``
holds, in ms after the step's first gather was asked for::

    unit, phase        which unit, in 'forward' or 'backward'
    prefetched         its gather was posted ahead of time (async)
    issued_ms          when that gather was posted (None: synchronous)
    gather_start_ms    when it started moving bytes (the background thread
    gather_end_ms      took it up) and when it ended
    needed_ms          when the unit asked for its weights (its compute begins
                       once they are there)
    compute_end_ms     when the unit was done and freed them again
    hidden_ms          the part of [gather_start, gather_end] before needed_ms

and a last entry ``{hidden_fraction}``::

    hidden_fraction = sum_u hidden_u / sum_u (gather_end_u - gather_start_u)

Without prefetch every gather starts when the unit needs it: nothing hides.
With it, the first unit of each phase still waits (nothing was running before
it), and a gather is hidden as far as the previous unit's compute is long
enough. ``render`` draws it as text (bench/bench_zero.py).
"""
from __future__ import annotations

import time
from typing import Any


MAX_EVENTS = 10_000  # a run that never steps (inference) starts over after this many


class GatherTimeline:
    """Records the gathers and computes of one step (Zero3 keeps one)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.events: list[dict] = []

    def needed(self, unit: int, phase: str, work: Any, issued_at: float | None) -> dict:
        """Unit ``unit`` asks for its weights now; ``work`` is its gather's Work
        (prefetched, with ``issued_at``) or None (gathered now, synchronously)."""
        now = time.perf_counter()
        if len(self.events) >= MAX_EVENTS:
            self.t0, self.events = None, []
        if self.t0 is None:
            self.t0 = now if issued_at is None else min(now, issued_at)
        event = dict(unit=unit, phase=phase, prefetched=work is not None, work=work,
                     issued=issued_at, needed=now, start=None, end=None, compute_end=None)
        if work is None:
            event["start"] = now
        self.events.append(event)
        return event

    def finish(self) -> list[dict]:
        """The step's timeline (module docstring); call after its last gather."""
        out = []
        t0 = self.t0 or 0.0

        def ms(t: float | None) -> float | None:
            return None if t is None else 1e3 * (t - t0)
        for e in self.events:
            work = e["work"]
            start = getattr(work, "started_at", None) if work is not None else e["start"]
            end = getattr(work, "finished_at", None) if work is not None else e["end"]
            hidden = 0.0 if start is None or end is None else max(0.0, min(end, e["needed"]) - start)
            out.append(dict(unit=e["unit"], phase=e["phase"], prefetched=e["prefetched"],
                            issued_ms=ms(e["issued"]), gather_start_ms=ms(start),
                            gather_end_ms=ms(end), needed_ms=ms(e["needed"]),
                            compute_end_ms=ms(e["compute_end"]), hidden_ms=1e3 * hidden))
        total = sum(e["gather_end_ms"] - e["gather_start_ms"] for e in out
                    if e["gather_start_ms"] is not None and e["gather_end_ms"] is not None)
        hidden = sum(e["hidden_ms"] for e in out)
        out.append(dict(hidden_fraction=hidden / total if total > 0 else 0.0))
        self.t0, self.events = None, []
        return out


def render(timeline: list[dict], width: int = 60) -> str:
    """One line per unit use: '#' gathering, '=' computing, '.' waiting for the gather."""
    events = timeline[:-1]
    end_all = max([e["compute_end_ms"] or 0.0 for e in events]
                  + [e["gather_end_ms"] or 0.0 for e in events] + [1e-9])
    scale = width / end_all
    lines = []
    for e in events:
        row = [" "] * (width + 1)
        start = e["needed_ms"] if e["gather_start_ms"] is None else e["gather_start_ms"]
        end = start if e["gather_end_ms"] is None else e["gather_end_ms"]
        g0, g1 = int(start * scale), int(end * scale)
        c0 = int(max(e["needed_ms"], end) * scale)
        c1 = int((end if e["compute_end_ms"] is None else e["compute_end_ms"]) * scale)
        for x in range(int(e["needed_ms"] * scale), c0):
            row[x] = "."
        for x in range(c0, max(c1, c0 + 1)):
            row[min(x, width)] = "="
        for x in range(g0, max(g1, g0 + 1)):
            row[min(x, width)] = "#"
        lines.append(f"  {e['phase']:<8} unit {e['unit']:>2} {''.join(row)}  gather "
                     f"{start:6.1f}-{end:6.1f}, needed "
                     f"{e['needed_ms']:6.1f} ms")
    lines.append(f"  hidden fraction of the gathers: {timeline[-1]['hidden_fraction']:.2f}")
    return "\n".join(lines)
