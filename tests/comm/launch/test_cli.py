"""``minidist run -n N script.py``: like torchrun, loud on failure, Ctrl-C stops all."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ..conftest import alive

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

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
        assert f"[rank {r}] rank {r} of 3 local {r}: 6.0 ['a', 'b']" in out.stdout


def test_run_exits_nonzero_with_the_failing_ranks_traceback_once(tmp_path):
    out = _run(tmp_path, "fail")
    assert out.returncode == 1
    assert "rank 1 failed (RuntimeError)" in out.stderr and "rank 1 gives up" in out.stderr
    assert out.stderr.count("Traceback") == 1
    assert 'script.py", line' in out.stderr and "runpy" not in out.stderr  # the user's frames
    assert "ranks [0, 2] were stopped" in out.stderr


KILLED = textwrap.dedent("""
    import os, signal
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm import PeerDiedError
    dist.init_process_group()
    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(xp.ones(3))
    except PeerDiedError as e:
        print(f"went on without rank {e.rank}", flush=True)
""")


def test_fault_tolerant_run_lets_the_others_go_on_and_says_who_was_lost(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "3", "--fault-tolerant",
           str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "[rank 0] went on without rank 2" in out.stdout
    assert "[rank 1] went on without rank 2" in out.stdout
    assert ("minidist run: rank 2 lost (exit code -9 (SIGKILL)); the others went on "
            "without it (--fault-tolerant)") in out.stderr


LINES = textwrap.dedent("""
    import os
    r = os.environ["RANK"]
    for i in range(150):
        print(f"line {i} " + "x" * (500 + 37 * i) + f" end {r}")
    os.write(2, f"to stderr from {r}".encode())   # no newline: flushed when the rank ends
""")


def test_every_line_is_whole_and_prefixed_with_its_rank_even_unbuffered(tmp_path):
    script = tmp_path / "lines.py"
    script.write_text(LINES)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    out = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "3", str(script)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 * 150
    pattern = re.compile(r"\[rank (\d)\] line (\d+) x+ end (\d)")
    for line in lines:
        m = pattern.fullmatch(line)
        assert m and m[1] == m[3] and len(line) == len(f"[rank 0] line {m[2]} ") + \
            500 + 37 * int(m[2]) + len(" end 0"), line[:80]
    for r in range(3):
        assert f"[rank {r}] to stderr from {r}\n" in out.stderr


def test_log_dir_keeps_each_ranks_output_per_attempt_and_redirects_leave_the_console(tmp_path):
    script = tmp_path / "lines.py"
    script.write_text(LINES)
    logs = tmp_path / "logs"
    out = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2", "--log-dir",
                          str(logs), "--redirects", "1", str(script)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""                                  # stdout went to the files only
    for r in range(2):
        text = (logs / "attempt_0" / f"rank_{r}" / "stdout.log").read_text()
        assert text.count("\n") == 150 and text.startswith("line 0 x") and f"end {r}\n" in text
        assert (logs / "attempt_0" / f"rank_{r}" / "stderr.log").read_text() == \
            f"to stderr from {r}\n"
        assert f"[rank {r}] to stderr from {r}" in out.stderr  # teed by default


def test_run_timeout_blames_no_rank_and_reports_what_each_was_doing(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.replace('if "hang" in sys.argv:', 'if "hang" in sys.argv and dist.get_rank() == 1:'))
    cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "3", "--timeout", "3",
           str(script), "hang"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 124, out.stderr
    assert "did not finish within 3 s; no rank failed. Ranks [0, 1, 2] were still running" \
        in out.stderr
    assert "rank 1 did not enter barrier #2 of group [0, 1, 2], which ranks 0, 2 wait in" \
        in out.stderr
    assert "_run_script" not in out.stderr and "run_script" not in out.stderr


@pytest.mark.parametrize("args", [["-n", "0"], ["-n", "two"], ["--max-restarts", "-1"],
                                  ["--timeout", "0"], ["--tee", "5"], ["--redirects", "1"],
                                  ["--nproc-per-node", "-3"], ["no_such_script.py"]])
def test_bad_values_are_a_one_line_usage_error(tmp_path, args):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    if args[-1] != "no_such_script.py":
        args = args + [str(script)]
    out = subprocess.run([sys.executable, "-m", "minidist.cli", "run", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].startswith("minidist run: error: "), out.stderr


def test_version_and_plain_help():
    import minidist
    out = subprocess.run([sys.executable, "-m", "minidist.cli", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"minidist {minidist.__version__}"
    out = subprocess.run([sys.executable, "-m", "minidist.cli", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "``" not in out.stdout and "--version" in out.stdout


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


MISMATCH = textwrap.dedent("""
    import minidist.distributed as dist
    from minidist.backend import xp
    dist.init_process_group(timeout=2.0)
    rank = dist.get_rank()
    x = xp.ones(4 if rank == 0 else 6)
    if "hang" in __import__("sys").argv:
        x = xp.ones(4)
        dist.all_reduce(x)
        if rank == 1:
            __import__("time").sleep(20)   # never enters the second all-reduce
    dist.all_reduce(x)
""")


def _run_failing(tmp_path, *args):
    script = tmp_path / "user_script.py"
    script.write_text(MISMATCH)
    cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "2", *args, str(script)]
    if "--hang" in args:
        cmd = [c for c in cmd if c != "--hang"] + ["hang"]
    env = {k: v for k, v in os.environ.items() if k != "MINIDIST_VERBOSE"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def _minidist_frames(text):
    import minidist
    package = os.path.dirname(os.path.abspath(minidist.__file__))
    return [line for line in text.splitlines() if line.strip().startswith(f'File "{package}')]


def test_a_mismatch_reports_the_script_frames_then_the_message_with_each_ranks_call(tmp_path):
    out = _run_failing(tmp_path)
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert lines[0].startswith("minidist run: rank 0 failed (CollectiveMismatchError)"), out.stderr
    assert 'user_script.py", line 12, in <module>' in out.stderr
    assert _minidist_frames(out.stderr) == [] and "frames inside minidist hidden" in out.stderr
    assert lines[-3].startswith("minidist.comm.errors.CollectiveMismatchError: ")  # ends with it
    assert "rank 0: all_reduce" in lines[-2] and "shape=(4,)" in lines[-2]
    assert "rank 1: all_reduce" in lines[-1] and "shape=(6,)" in lines[-1]


def test_verbose_shows_minidist_frames_of_the_same_failure(tmp_path):
    out = _run_failing(tmp_path, "--verbose")
    assert out.returncode == 1 and "CollectiveMismatchError" in out.stderr
    assert _minidist_frames(out.stderr) and "hidden" not in out.stderr


def test_a_hang_report_names_the_missing_rank_and_how_to_change_the_timeout(tmp_path):
    out = _run_failing(tmp_path, "--hang")
    assert out.returncode == 1
    assert out.stderr.startswith("minidist run: rank 0 failed (CommTimeoutError); "
                                 "ranks [1] were stopped:"), out.stderr
    assert _minidist_frames(out.stderr) == [] and 'user_script.py", line 12' in out.stderr
    assert "rank 1 did not enter all_reduce #2 of group [0, 1], which rank 0 waits in" in out.stderr
    assert "rank 1: all_reduce #1 of group [0, 1]" in out.stderr     # each rank's last call
    last = out.stderr.splitlines()[-1]
    assert "init_process_group(timeout=SECONDS)" in last and "--timeout" in last
