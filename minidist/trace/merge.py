"""One file per run: the ranks' part files merged into one Chrome trace.

    merge("run.json")                    # run.json.<pid>.part, ... -> run.json
    merge("run.json.gz", failures=[...]) # gzip when the name ends in .gz

Each part holds one process's events without a pid (recorder.py); here each
process becomes a trace process: pid = rank (+ 1000 per restart of the world,
+ 10000 per world a script started before this one), named
``rank 3 (dp 1, pp 1, tp 0)``, or ``world 2 rank 3 (...)`` when the run started
several worlds one after another, and a process that never joined a world
(the script around ``minidist.launch``) is named by its OS pid. The ranks of
every world number their messages from 0, so the flow ids of world k > 0 are
rehashed with k: each world's arrows join its own ranks. Times are
shifted so that the run starts at 0; under MPI each rank's clock offset to
rank 0 is added first. A part cut short (the rank was killed) loses at most its
last, half-written line. ``failures`` (from the launcher) become instant events
on the failed rank: a run that fails still leaves its trace up to the failure.

Output: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``,
which ui.perfetto.dev and chrome://tracing open.
"""
from __future__ import annotations

import contextlib
import glob
import gzip
import io
import json
import os
import re
import tempfile
import time
from typing import Any

from minidist import untrusted

WORLD_PID = 10000       # pid = rank + 1000 * attempt + WORLD_PID * world
NO_RANK_PID = 1000000   # pids of processes that are not ranks start here
FLOW_MASK = (1 << 52) - 1    # flow ids stay exact in JavaScript's doubles
MESH_PREFIX = "mesh_"        # a DeviceMesh describes its groups "mesh_<dim>" (torch's group_desc)


def mesh_dim_of(group_desc: str) -> dict:
    """{"mesh_dim": "tp"} for a group a device mesh made (described "mesh_tp"), else {}: the
    label a call's span carries, so the trace says which dimension each collective is."""
    if group_desc.startswith(MESH_PREFIX):
        return {"mesh_dim": group_desc[len(MESH_PREFIX):]}
    return {}


def parts_of(path: str) -> list[str]:
    """The part files of ``path``: ``<path>.<pid>.part``, nothing else that matches."""
    form = re.compile(re.escape(os.path.basename(path)) + r"\.\d+\.part")
    return sorted(p for p in glob.glob(glob.escape(path) + ".*.part")
                  if form.fullmatch(os.path.basename(p)))


def remove_parts(path: str) -> None:
    for part in parts_of(path):
        os.remove(part)


def read_part(part: str) -> tuple[list[dict], bool]:
    """(events, complete): each line is a list of rows (one flush of the
    recorder) or the end mark; a line that does not parse ends the part (the
    rank was killed while writing it)."""
    events, complete = [], False
    text = untrusted.read_regular(part, untrusted.MAX_TRACE_BYTES, "trace part")
    for line in text.decode(errors="replace").splitlines():
        try:
            rows = json.loads(line)
        except json.JSONDecodeError:
            break
        if isinstance(rows, list):     # one flush of the recorder
            events.extend(event_of(row) for row in rows)
        elif isinstance(rows, dict) and rows.get("end"):
            complete = True
    return events, complete


def event_of(row: list) -> dict:
    """A recorder's row (recorder.py) as a Trace Event; times from nanoseconds
    to microseconds, kept to the nanosecond."""
    ph = row[0]
    if ph == "X":
        _, name, cat, start, end, tid, args = row
        event = {"ph": "X", "name": name, "cat": cat, "ts": start / 1000,
                 "dur": (end - start) / 1000, "tid": tid}
    elif ph == "i":
        _, name, cat, ts, tid, scope, args = row
        event = {"ph": "i", "name": name, "cat": cat, "ts": ts / 1000, "tid": tid, "s": scope}
    elif ph in ("s", "f"):      # a flow leaves (the send) or lands (the receive)
        _, fid, ts, tid, *to_itself = row     # (recorder.SELF: a rank's message to itself)
        event = {"ph": ph, "name": "message to itself" if to_itself else "message",
                 "cat": "flow", "id": fid, "ts": ts / 1000, "tid": tid}
        if ph == "f":
            event["bp"] = "e"
        return event
    elif ph == "C":
        _, name, ts, values = row
        return {"ph": "C", "name": name, "ts": ts / 1000, "tid": 0, "args": values}
    elif ph == "M":
        return row[1]
    else:
        raise ValueError(f"a trace part holds a row of unknown kind {ph!r}: {row!r:.80}")
    if args:
        event["args"] = args
    return event


def completed_ranks(path: str) -> set[int]:
    """Ranks whose part is complete (their recorder was closed)."""
    done = set()
    for part in parts_of(path):
        events, complete = read_part(part)
        rank = _meta(events, "minidist_rank")
        if complete and rank is not None:
            done.add(rank["rank"])
    return done


def wait_for_ranks(path: str, world_size: int, timeout: float = 10.0) -> bool:
    """Wait until every rank's part is complete; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while len(completed_ranks(path)) < world_size:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def merge(path: str, failures: list[dict] | None = None, keep_parts: bool = False) -> dict:
    """Merge the parts of ``path`` into ``path`` (see module docstring); returns
    the trace. ``failures``: dicts with ``rank``, ``at`` (perf_counter seconds),
    ``message``, ``attempt`` (default 0)."""
    parts = parts_of(path)
    if not parts:
        raise FileNotFoundError(f"no trace parts {path}.<pid>.part to merge: was the run "
                                f"started with --trace {path} or MINIDIST_TRACE={path}?")
    processes = []
    for k, part in enumerate(parts):
        events, complete = read_part(part)
        process = _as_process(events, complete, NO_RANK_PID + k, part)
        if process["rank"] is not None or any(e["ph"] != "M" for e in process["events"]):
            processes.append(process)   # (a process that recorded nothing is left out)
    if len({p["world"] for p in processes if p["rank"] is not None}) > 1:
        for p in processes:   # several worlds: each rank's name says which
            if p["rank"] is not None:
                p["name"]["name"] = f"world {p['world']} {p['name']['name']}"
    pid_of = {(p["attempt"], p["rank"]): p["pid"] for p in processes
              if p["rank"] is not None and p["world"] == 0}
    out: list[dict] = []
    for p in processes:
        out.extend(p["events"])
    for failure in failures or []:   # (from the launcher, which starts one world)
        pid = pid_of.get((failure.get("attempt", 0), failure["rank"]),
                         failure["rank"] + 1000 * failure.get("attempt", 0))
        out.append({"ph": "i", "name": f"rank {failure['rank']} failed", "cat": "failure",
                    "ts": round(failure["at"] * 1e6, 3), "pid": pid, "tid": 0, "s": "p",
                    "args": {"message": failure["message"]}})
    timed = [e["ts"] for e in out if "ts" in e and e["ph"] != "M"]
    origin = min(timed) if timed else 0.0
    for e in out:
        if "ts" in e:
            e["ts"] = round(e["ts"] - origin, 3)
    trace = {"traceEvents": out, "displayTimeUnit": "ms",
             "otherData": {"producer": "minidist", "origin_perf_counter_us": origin,
                           "incomplete_ranks": sorted(p["rank"] for p in processes
                                                      if not p["complete"] and p["rank"] is not None)}}
    write(path, trace)
    if not keep_parts:
        for part in parts:
            os.remove(part)
    return trace


def write(path: str, trace: dict) -> None:
    """Write atomically (a reader never sees half a file); gzip for ``.gz``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-",
                               dir=os.path.dirname(os.path.abspath(path)))
    try:
        with open(fd, "wb") as raw:
            with (gzip.GzipFile(fileobj=raw, mode="wb") if path.endswith(".gz") else
                  contextlib.nullcontext(raw)) as f:
                f.write(json.dumps(trace, separators=(",", ":")).encode())
        os.chmod(tmp, 0o644)           # (mkstemp's 0600: a trace is for sharing)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load(path: str) -> dict:
    """A merged trace (plain or gzipped JSON); a bare list of events is accepted too.
    A regular file only, at most ``MAX_TRACE_BYTES`` once decompressed (untrusted.py); a
    file that is not a trace is a ValueError saying so, suggesting a merge only where
    parts are."""
    try:
        data = untrusted.read_regular(path, untrusted.MAX_TRACE_BYTES, "trace")
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = untrusted.read_capped(f, untrusted.MAX_TRACE_BYTES, path)
        trace = json.loads(data)
    except FileNotFoundError:
        raise FileNotFoundError(f"no trace at {path}{_parts_hint(path)}") from None
    except (json.JSONDecodeError, OSError, UnicodeDecodeError, EOFError) as e:
        raise ValueError(f"{path} is not a trace: not JSON ({e}){_parts_hint(path)}") from None
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path} is not a trace: JSON without a list of traceEvents")
    return trace


def _parts_hint(path: str) -> str:
    """Where a run left part files beside ``path`` (still going, or killed): how to merge."""
    parts = parts_of(path)
    if not parts:
        return ""
    return (f"; {len(parts)} part file(s) of a run are beside it (still going, or killed): "
            f"`minidist trace merge {path}`")


def _meta(events: list[dict], name: str) -> dict | None:
    found = None
    for e in events:
        if e.get("ph") == "M" and e.get("name") == name:
            found = e["args"]
    return found


def _as_process(events: list[dict], complete: bool, fallback_pid: int, part: str) -> dict:
    """Give one part's events their pid and name; apply the clock offset."""
    info = _meta(events, "minidist_rank")
    coords = _meta(events, "minidist_coords")
    if info is None:
        rank, attempt, offset, world = None, 0, 0.0, 0
        pid, name = fallback_pid, f"process {part.rsplit('.', 2)[-2]} (not a rank)"
    else:
        rank, attempt, offset = info["rank"], info.get("attempt", 0), info.get("clock_offset_us", 0.0)
        world = info.get("world", 0)
        pid = rank + 1000 * attempt + WORLD_PID * world
        name = f"rank {rank}"
        if coords:
            name += " (" + ", ".join(f"{d} {i}" for d, i in coords.items()) + ")"
        if attempt:
            name += f" attempt {attempt}"
    kept = []
    for e in events:
        if e.get("ph") == "M" and e.get("name", "").startswith("minidist_"):
            continue
        e["pid"] = pid
        if world and "id" in e:   # this world's flows, apart from the other worlds'
            e["id"] = hash((world, e["id"])) & FLOW_MASK
        if "ts" in e and offset:
            e["ts"] = round(e["ts"] + offset, 3)
        kept.append(e)
    named = {"name": name}   # (merge prefixes the world when there are several)
    kept.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": named})
    kept.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                 "args": {"sort_index": pid}})
    if rank is not None:
        kept.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                     "args": {"labels": f"world {info['world_size']}"}})
    return dict(events=kept, complete=complete, rank=rank, attempt=attempt, pid=pid,
                world=world, name=named)
