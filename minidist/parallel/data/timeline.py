"""The bucket timeline of one DDP backward: what overlapped with what.

For each bucket DDP records, in ms after forward ended (``ddp.timeline``)::

    ready_ms        its last gradient arrived: its communication may start
    comm_start_ms   the background thread started its first collective
    comm_end_ms     ... and finished its last one
    hidden_ms       the part of [comm_start, comm_end] before backward ended
    cpu_ms          CPU time the background thread spent on it (copies, adds):
                    on a machine with a core per rank and no spare one, this
                    is taken from backward, overlap or not

and a last entry ``{backward_end_ms, hidden_fraction}``. Communication that
runs while backward still computes costs nothing; what runs after it is the
exposed part of the step::

    hidden_fraction = sum_b hidden_b / sum_b (comm_end_b - comm_start_b)

The last bucket becomes ready when backward ends, so its communication can
never hide: with perfect overlap the step is compute + that bucket's time.
``render`` draws it as text (bench/bench_ddp.py, demos/04_ddp.py); ``trace_buckets``
puts the same spans into a trace (minidist/trace/), whose summary recomputes the
hidden fraction from them.
"""
from __future__ import annotations

from typing import Any


def bucket_event(bucket: Any, future: Any, t0: float, backward_end: float) -> dict:
    """One bucket's row of the timeline (times in ms after ``t0``)."""
    def ms(t: float | None) -> float | None:
        return None if t is None else 1e3 * (t - t0)
    start, end = future.started_at, future.finished_at
    ended = 1e3 * (backward_end - t0)
    hidden = 0.0
    if start is not None and end is not None:
        hidden = max(0.0, min(ms(end), ended) - ms(start))
    return dict(bucket=bucket.index, params=len(bucket.params), bytes=bucket.nbytes,
                ready_ms=ms(bucket.launched_at), comm_start_ms=ms(start), comm_end_ms=ms(end),
                hidden_ms=hidden,
                cpu_ms=1e3 * sum(getattr(w, "cpu_s", 0.0) for w in getattr(future, "works", [])),
                done_before_backward_end=end is not None and end <= backward_end)


def hidden_fraction(events: list[dict]) -> float:
    """Share of the buckets' communication time that ran before backward ended."""
    total = sum(e["comm_end_ms"] - e["comm_start_ms"] for e in events
                if e["comm_start_ms"] is not None and e["comm_end_ms"] is not None)
    return sum(e["hidden_ms"] for e in events) / total if total > 0 else 0.0


def render(timeline: list[dict], width: int = 60) -> str:
    """The timeline as text: one line per bucket, '.' waiting, '#' communicating,
    '|' where backward ended."""
    events, last = timeline[:-1], timeline[-1]
    end_all = max([last["backward_end_ms"]] + [e["comm_end_ms"] or 0.0 for e in events])
    scale = width / end_all if end_all > 0 else 0.0
    lines = []
    for e in events:
        row = [" "] * (width + 1)
        ready = int((e["ready_ms"] or 0.0) * scale)
        start = int((e["comm_start_ms"] or 0.0) * scale)
        stop = int((e["comm_end_ms"] or 0.0) * scale)
        for x in range(ready, start):
            row[x] = "."
        for x in range(start, max(stop, start + 1)):
            row[min(x, width)] = "#"
        row[min(int(last["backward_end_ms"] * scale), width)] = "|"
        lines.append(f"  bucket {e['bucket']:>2} {''.join(row)}  ready {e['ready_ms']:6.1f}, "
                     f"comm {e['comm_start_ms']:6.1f}-{e['comm_end_ms']:6.1f} ms")
    lines.append(f"  backward ended at {last['backward_end_ms']:.1f} ms; hidden fraction of "
                 f"the communication: {last['hidden_fraction']:.2f}")
    return "\n".join(lines)


def trace_buckets(recorder: Any, buckets: list, backward_end: float) -> None:
    """Each bucket's communication as a span on the thread that ran it, from the
    same times as ``bucket_event``, and the end of backward as an instant."""
    step = recorder.next_step("ddp")
    for b in buckets:
        future = b.work
        start, end = future.started_at, future.finished_at
        if start is None or end is None:
            continue
        thread = future.works[0].thread if future.works else None
        recorder.span(f"DDP bucket {b.index}", "ddp", start, end,
                      dict(step=step, bucket=b.index, bytes=b.nbytes, params=len(b.params),
                           ready_us=round(b.launched_at * 1e6, 3)),
                      tid=recorder.tid_of(thread))
    recorder.instant("DDP backward end", "ddp", dict(step=step), at=backward_end)
