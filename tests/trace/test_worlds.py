"""A script that starts several worlds one after another under one recording
(``MINIDIST_TRACE`` or ``minidist.trace.record``) gets one trace in which each
world is a set of processes of its own: its ranks named ``world k rank r``,
its flows matched within it (the ranks of every world number their messages
from 0), and the whole file valid by ``trace check``. One world stays as before:
pids = ranks, named ``rank r``. A rank's message to itself is a flow on one
process, which the check accepts.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from minidist import trace
from minidist.trace.check import check
from minidist.trace.merge import WORLD_PID
from minidist.trace.summary import render, summarize

SCRIPT = textwrap.dedent("""
    import sys
    import minidist.distributed as dist
    from minidist import trace
    from minidist.backend import xp
    from minidist.comm import World

    def work():
        rank = dist.get_rank()
        x = xp.ones(64, dtype="float64") * (rank + 1)
        dist.all_reduce(x)
        peer = (rank + 1) % dist.get_world_size()
        dist.send(x, peer)
        dist.recv(x, (rank - 1) % dist.get_world_size())
        dist.isend(x, rank).wait()     # a message to itself (as a V-shaped pipeline's)
        dist.recv(x, rank)
        return float(x.sum())

    def worlds(n):
        for k in range(n):
            with World(2 + k % 2, timeout=30.0, run_timeout=60.0) as world:
                world.run(work)

    if __name__ == "__main__":
        n, how, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
        if how == "record":
            with trace.record(out):
                worlds(n)
        else:                          # MINIDIST_TRACE=out in the environment
            worlds(n)
""")


def _run(tmp_path, worlds: int, how: str) -> dict:
    script, out = tmp_path / "worlds.py", str(tmp_path / "run.json")
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM", "MINIDIST_TRACE_MERGE")}
    env.pop("MINIDIST_TRACE", None)
    if how == "env":
        env["MINIDIST_TRACE"] = out
    result = subprocess.run([sys.executable, str(script), str(worlds), how, out],
                            capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob("run.json.*.part")), "parts left after the merge"
    return trace.load(out)


def _names(t: dict) -> dict:
    return {e["pid"]: e["args"]["name"] for e in t["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


@pytest.mark.parametrize("worlds, how", [(1, "env"), (2, "record"), (3, "env")])
def test_each_world_of_a_run_is_its_own_processes_with_its_own_flows(tmp_path, worlds, how):
    t = _run(tmp_path, worlds, how)
    assert check(t) == []
    sizes = [2 + k % 2 for k in range(worlds)]
    if worlds == 1:                    # one world: as before, pid = rank, "rank r"
        want = {r: f"rank {r}" for r in range(sizes[0])}
    else:
        want = {k * WORLD_PID + r: f"world {k} rank {r}"
                for k, size in enumerate(sizes) for r in range(size)}
    assert _names(t) == want
    flows = {}
    for e in t["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    # per world: its sends to others (send + all-reduce) and one to itself per rank
    per_world = {}
    for pair in flows.values():
        s, f = pair["s"], pair["f"]
        assert s["pid"] // WORLD_PID == f["pid"] // WORLD_PID, "a flow across worlds"
        assert (s["pid"] == f["pid"]) == (s["name"] == "message to itself")
        per_world.setdefault(s["pid"] // WORLD_PID, []).append(s["pid"] == f["pid"])
    assert sorted(per_world) == list(range(worlds))
    for k, size in enumerate(sizes):
        assert sum(per_world[k]) == size             # each rank's message to itself
    text = render(summarize(t))
    for name in want.values():
        assert f"\n{name} " in text


def test_demo_17_traced_passes_check(tmp_path):
    """A V-shaped pipeline's two chunks on the last rank hand over in memory, as torch's
    stages on one rank do: the trace checks, with no message to itself."""
    out = str(tmp_path / "zb.json")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    env["MINIDIST_TRACE"] = out
    demo = pathlib.Path(__file__).resolve().parents[2] / "demos" / "17_zero_bubble.py"
    result = subprocess.run([sys.executable, str(demo), "-p", "2", "-m", "4", "--op-ms", "5"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    t = trace.load(out)
    assert check(t) == []
    assert any(e["ph"] == "s" for e in t["traceEvents"])          # the ranks' messages
    assert not any(e["ph"] == "s" and e["name"] == "message to itself" for e in t["traceEvents"])
