"""``minidist trace``: read a run's trace back.

    minidist trace summary run.json          # per rank: busy, idle, exposed communication
    minidist trace plot run.json run.png     # the timeline as a figure
    minidist trace merge run.json            # merge parts a run left (it was killed)
    minidist trace check run.json            # is it a valid Trace Event file?

Open the JSON itself in ui.perfetto.dev (drag the file in) or chrome://tracing.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable


def add_arguments(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = parser.add_subparsers(dest="action", required=True)
    summary = sub.add_parser("summary", help="per rank: busy, idle, communication, the "
                             "pipeline bubble, DDP's hidden fraction")
    summary.add_argument("trace", help="a trace file (run.json or run.json.gz)")
    plot = sub.add_parser("plot", help="draw the timeline into an image (needs matplotlib)")
    plot.add_argument("trace")
    plot.add_argument("image", help="the image to write (.png, .svg, .pdf)")
    plot.add_argument("--start", type=float, default=None, metavar="MS", help="from MS ms")
    plot.add_argument("--end", type=float, default=None, metavar="MS", help="to MS ms")
    merge = sub.add_parser("merge", help="merge the part files of a run into one trace")
    merge.add_argument("trace")
    check = sub.add_parser("check", help="check the file against the Trace Event format")
    check.add_argument("trace")

    def run(ns: argparse.Namespace) -> int:
        from minidist.trace.merge import load, merge as merge_parts
        try:
            if ns.action == "merge":
                merged = merge_parts(ns.trace)
                print(f"{ns.trace}: {len(merged['traceEvents'])} events")
                return 0
            trace = load(ns.trace)
        except (FileNotFoundError, ValueError) as e:
            print(f"minidist trace: {e}", file=sys.stderr)
            return 2
        if ns.action == "summary":
            from minidist.trace.summary import render, summarize
            print(render(summarize(trace)))
        elif ns.action == "plot":
            from minidist.trace.plot import plot as draw
            try:
                print(draw(trace, ns.image, ns.start, ns.end))
            except ValueError as e:
                print(f"minidist trace: {e}", file=sys.stderr)
                return 2
        else:
            from minidist.trace.check import check as problems_of
            problems = problems_of(trace)
            for line in problems[:20]:
                print(line)
            print(f"{ns.trace}: {len(trace['traceEvents'])} events, "
                  f"{len(problems)} problem(s)")
            return 1 if problems else 0
        return 0
    return run
