"""Seeing a run: every rank's spans, messages and counters in one Chrome trace.

    with minidist.trace.record("run.json"):       # or: minidist run --trace run.json train.py
        train_step()                              #     MINIDIST_TRACE=run.json mpiexec ...
    # minidist trace summary run.json ; minidist trace plot run.json run.png
    # open run.json in ui.perfetto.dev or chrome://tracing

What a trace holds (Trace Event format, times in microseconds on one clock):
a span ("X") for every collective and point-to-point call (group, bytes sent and
received, algorithm, peer), for the forward of every module by its dotted name,
the optimizer step, each pipeline op (F / B / W, micro-batch, chunk), each DDP
bucket's all-reduce on the thread that runs it, ZeRO's gathers and
reduce-scatters, checkpoint writes; a flow ("s" -> "f") from every send to the
receive that took it, across ranks; counters ("C") of bytes sent and of live
array memory; failures and hang reports as instant events ("i").

Recording is off unless started, and then costs one ``if`` per event site.

Files, in reading order:

- recorder.py  the recorder of one process: events, flow ids both ends compute, the part file
- session.py   when recording starts and stops (``record``), which process merges
- merge.py     the parts of a run into one JSON (gzipped for .gz), failures as events;
               each world of a run that starts several its own processes
- check.py     what makes a trace valid: keys per phase, flows matched, spans nested
- summary.py   reading it back: busy, idle and exposed communication per rank, the
               pipeline bubble, DDP's hidden fraction
- plot.py      the timeline as a figure (matplotlib)
- command.py   ``minidist trace summary | plot | merge | check``

Imports nothing of minidist but ``backend``; every layer above records into it.
Docs: docs/tracing.md. Demo: demos/20_trace.py. Tests: tests/trace/.
"""
from minidist.trace.merge import load, merge
from minidist.trace.recorder import start, stop
from minidist.trace.session import record, record_script_from_env

__all__ = ["record", "start", "stop", "merge", "load"]

record_script_from_env()   # MINIDIST_TRACE=run.json python script.py: this process records
