"""The same script traced under every launcher: ``minidist run --trace``,
``MINIDIST_TRACE`` under ``mpiexec``, and a run killed mid-step.

Each merged file must load and follow the Trace Event format; the killed run's
file holds the failure as an instant event and the spans up to it (messages to
the killed rank may have no receive, so only those may go unmatched).
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from minidist import trace
from minidist.trace.check import check

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.nn import Linear
    dist.init_process_group()
    layer = Linear(16, 16)
    x = xp.ones(4096, dtype="float32")
    for step in range(3):
        layer(xp.ones((4, 16), dtype="float32"))
        dist.all_reduce(x)
        dist.broadcast(x, 0)
    if dist.get_rank() == 1 and "--kill" in sys.argv:
        time.sleep(0.3)           # its spans so far reach the file (FLUSH_S = 0.2)
        os.kill(os.getpid(), 9)   # dies without a word, in the middle of the step
    dist.all_reduce(x)
    dist.barrier()
""")


def _env():
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MINIDIST_SHM", "MINIDIST_TRACE", "MINIDIST_TRACE_MERGE"):
        env.pop(k, None)
    return env


def _minidist_run(tmp_path, out, *args):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "3", "--trace", out, str(script),
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())


def _spans(t, name):
    return [e for e in t["traceEvents"] if e["ph"] == "X" and e["name"] == name]


def test_minidist_run_trace_merges_every_rank(tmp_path):
    out = str(tmp_path / "run.json")
    result = _minidist_run(tmp_path, out)
    assert result.returncode == 0, result.stderr
    t = trace.load(out)
    assert check(t) == []
    assert {e["pid"] for e in _spans(t, "all_reduce")} == {0, 1, 2}
    assert len(_spans(t, "Linear")) == 3 * 3
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


def test_a_killed_run_leaves_a_loadable_trace_with_the_failure(tmp_path):
    out = str(tmp_path / "run.json.gz")
    result = _minidist_run(tmp_path, out, "--kill")
    assert result.returncode == 1
    t = trace.load(out)
    assert check(t, flows_matched=False) == []
    failed = [e for e in t["traceEvents"] if e["ph"] == "i" and e["name"] == "rank 1 failed"]
    assert len(failed) == 1 and "SIGKILL" in failed[0]["args"]["message"]
    assert len([e for e in _spans(t, "all_reduce") if e["pid"] == 1]) >= 3   # before the kill
    assert failed[0]["ts"] >= max(e["ts"] for e in _spans(t, "all_reduce") if e["pid"] == 1)
    assert 1 in t["otherData"]["incomplete_ranks"]


MPIEXEC = shutil.which("mpiexec")


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH")
def test_minidist_trace_under_mpiexec_is_merged_by_rank_0(tmp_path):
    pytest.importorskip("mpi4py", reason="the MPI tests need: pip install 'minidist[mpi]'")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = str(tmp_path / "run.json")
    env = dict(_env(), MINIDIST_TRACE=out)
    result = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    t = trace.load(out)
    assert check(t) == []
    assert {e["pid"] for e in _spans(t, "all_reduce")} == {0, 1}
    offsets = [e for e in t["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert offsets   # rank 1's spans, shifted by its clock offset to rank 0
