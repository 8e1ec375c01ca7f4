"""What makes a trace valid: the rules of the Trace Event format that viewers rely on.

    problems = check(load("run.json"))      # [] for a valid trace

- every event has ``ph``, ``pid`` and ``tid`` (integers) and, but for metadata, a
  numeric ``ts`` in microseconds; spans ("X") have a ``dur`` >= 0, a ``name`` and a
  ``cat``; counters ("C") and metadata ("M") carry ``args``;
- every flow start ("s") is matched by exactly one flow end ("f") with its id, on
  another rank (the receiver; the same rank only for a "message to itself"), no
  earlier than ... anything: the receive may be posted first, so only the
  pairing is checked;
- the spans of one thread nest: a span that starts inside another ends inside it
  (what viewers need to stack them; "X" events of one thread are a tree).
"""
from __future__ import annotations

from collections import Counter, defaultdict

REQUIRED = {
    "X": ("name", "cat", "ts", "dur", "pid", "tid"),
    "i": ("name", "ts", "pid", "tid", "s"),
    "s": ("name", "id", "ts", "pid", "tid"),
    "f": ("name", "id", "ts", "pid", "tid", "bp"),
    "C": ("name", "ts", "pid", "args"),
    "M": ("name", "pid", "args"),
}
NEST_SLACK_US = 0.002   # rounding of ts and dur to nanoseconds


def check(trace: dict, flows_matched: bool = True) -> list[str]:
    """The problems of ``trace`` (a dict with ``traceEvents``), as sentences.
    ``flows_matched=False``: a trace of a run that was killed, whose messages to
    the killed rank may never have been received."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    problems = []
    for k, e in enumerate(events):
        problems += _check_event(k, e)
    if flows_matched:
        problems += _check_flows(events)
    problems += _check_nesting(events)
    return problems


def _check_event(k: int, e: dict) -> list[str]:
    ph = e.get("ph")
    if ph not in REQUIRED:
        return [f"event {k}: unknown phase {ph!r}"]
    found = [f"event {k} ({ph}): no {key!r}" for key in REQUIRED[ph] if key not in e]
    for key in ("pid", "tid"):
        if key in e and (not isinstance(e[key], int) or isinstance(e[key], bool)):
            found.append(f"event {k} ({ph}): {key} {e[key]!r} is not an integer")
    for key in ("ts", "dur"):
        if key in e and not isinstance(e[key], (int, float)):
            found.append(f"event {k} ({ph}): {key} {e[key]!r} is not a number of microseconds")
    if ph == "X" and isinstance(e.get("dur"), (int, float)) and e["dur"] < 0:
        found.append(f"event {k} (X {e.get('name')}): negative dur {e['dur']}")
    return found


def _check_flows(events: list[dict]) -> list[str]:
    events = [e for e in events if e.get("ph") in ("s", "f") and not _check_event(0, e)]
    starts = Counter(e["id"] for e in events if e.get("ph") == "s")
    ends = Counter(e["id"] for e in events if e.get("ph") == "f")
    start_pid = {e["id"]: e["pid"] for e in events
                 if e.get("ph") == "s" and e.get("name") != "message to itself"}
    found = []
    for fid, n in starts.items():
        if n != 1 or ends.get(fid, 0) != 1:
            found.append(f"flow {fid}: {n} start(s), {ends.get(fid, 0)} end(s)")
    for fid in ends:
        if fid not in starts:
            found.append(f"flow {fid}: an end without a start")
    for e in events:
        if e.get("ph") == "f" and start_pid.get(e["id"]) == e["pid"]:
            found.append(f"flow {e['id']}: ends on the rank that sent it (pid {e['pid']})")
    return found


def _check_nesting(events: list[dict]) -> list[str]:
    threads = defaultdict(list)
    for e in events:   # the spans whose keys are right (the others are reported already)
        if e.get("ph") == "X" and not _check_event(0, e):
            threads[(e["pid"], e["tid"])].append(e)
    found = []
    for (pid, tid), spans in threads.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[tuple[float, str]] = []   # (end, name) of the enclosing spans
        for e in spans:
            start, end = e["ts"], e["ts"] + e["dur"]
            while open_ends and open_ends[-1][0] <= start + NEST_SLACK_US:
                open_ends.pop()
            if open_ends and end > open_ends[-1][0] + NEST_SLACK_US:
                found.append(f"pid {pid} tid {tid}: {e['name']} [{start}, {end}] overlaps "
                             f"{open_ends[-1][1]} ending at {open_ends[-1][0]} without nesting")
            open_ends.append((end, e["name"]))
    return found
