"""``minidist run -n N script.py``: like torchrun, loud on failure, Ctrl-C stops all."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from ..conftest import alive

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import minidist.distributed as dist
    from minidist.backend import xp, to_host
    dist.init_process_group()
    x = xp.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    print(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} "
          f"local {os.environ.get('LOCAL_RANK')}: {to_host(x)[0]} {sys.argv[1:]}", flush=True)
    if "fail" in sys.argv and dist.get_rank() == 1:
        raise RuntimeError("rank 1 gives up")
    if "hang" in sys.argv:
        print(f"pid {os.getpid()}", flush=True)
        time.sleep(60)
    dist.barrier()
""")


def _run(tmp_path, *args, **kw):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "3", str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def test_run_starts_n_ranks_with_their_environment(tmp_path):
    out = _run(tmp_path, "a", "b")
    assert out.returncode == 0, out.stderr
    for r in range(3):
        assert f"rank {r} of 3 local {r}: 6.0 ['a', 'b']" in out.stdout


def test_run_exits_nonzero_with_the_failing_ranks_traceback(tmp_path):
    out = _run(tmp_path, "fail")
    assert out.returncode == 1
    assert "rank 1 failed (RuntimeError)" in out.stderr and "rank 1 gives up" in out.stderr


def test_ctrl_c_stops_every_rank(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, "-m", "minidist.cli", "run", "-n", "2",
                             str(script), "hang"], stdout=subprocess.PIPE, text=True)
    pids = []
    while len(pids) < 2:
        line = proc.stdout.readline()
        assert line, "the script ended early"
        # unbuffered ranks may interleave their prints: find the pids anywhere
        pids += [int(p) for p in re.findall(r"pid (\d+)", line)]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 130
    time.sleep(0.2)
    assert not [p for p in pids if alive(p)]


def test_a_script_runs_alone_as_a_world_of_one(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MINIDIST_SHM")}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "1.0" in out.stdout
