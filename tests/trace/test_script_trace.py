"""``MINIDIST_TRACE=run.json python script.py`` with a script of one process (no
world): the process records from the import of minidist to its exit and merges,
so its modules' spans are in the trace; a script that runs nothing traced says so
on stderr and writes nothing; the ``minidist`` command records nothing of its
own, so ``minidist trace summary run.json`` under the same variable leaves
``run.json`` as it was.
"""
import os
import subprocess
import sys
import textwrap

from minidist import trace
from minidist.trace.check import check

ONE_PROCESS = textwrap.dedent("""
    import numpy as np
    from minidist import Tensor, nn
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    model(Tensor(np.ones((3, 4), dtype=np.float32))).sum().backward()
""")


def _run(tmp_path, args, out):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM", "MINIDIST_TRACE_MERGE")}
    env["MINIDIST_TRACE"] = out
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)


def test_a_one_process_script_is_traced(tmp_path):
    script, out = tmp_path / "one.py", str(tmp_path / "run.json")
    script.write_text(ONE_PROCESS)
    result = _run(tmp_path, [str(script)], out)
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob("run.json.*.part")), "parts left after the merge"
    t = trace.load(out)
    assert check(t) == []
    spans = [e["name"] for e in t["traceEvents"] if e["ph"] == "X"]
    for name in ("Sequential", "0", "1", "Sequential backward", "0 backward", "1 backward"):
        assert name in spans, (name, spans)


def test_a_script_that_runs_nothing_traced_says_so_and_writes_nothing(tmp_path):
    out = str(tmp_path / "run.json")
    result = _run(tmp_path, ["-c", "import minidist"], out)
    assert result.returncode == 0, result.stderr
    assert "no trace was written" in result.stderr
    assert os.listdir(tmp_path) == []


def test_the_command_leaves_the_trace_it_reads_as_it_was(tmp_path):
    script, out = tmp_path / "one.py", str(tmp_path / "run.json")
    script.write_text(ONE_PROCESS)
    assert _run(tmp_path, [str(script)], out).returncode == 0
    before = open(out, "rb").read()
    result = _run(tmp_path, ["-m", "minidist.cli", "trace", "summary", out], out)
    assert result.returncode == 0, result.stderr
    assert "not a rank" in result.stdout
    assert open(out, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["one.py", "run.json"]
