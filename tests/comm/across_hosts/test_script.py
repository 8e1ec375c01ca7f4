"""scripts/two_hosts.py as a user runs it: a demo across two hosts, the bytes printed,
nothing left behind (no namespace, no state folder of its process)."""
import os
import re
import subprocess
import sys
import tempfile
import pytest

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))


def test_the_script_runs_demo_19_across_two_hosts_and_cleans_up(can_make_hosts):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "two_hosts.py"),
                             "-n", "4", "--timeout", "120",
                             os.path.join(ROOT, "demos", "19_topology.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "rank 2: host hostb, node 1 of 2, local rank 0 of 2" in out.stdout
    assert re.search(r"check: hierarchical all-reduce on 2 node\(s\) of 2: .*: ok", out.stdout)
    sent = re.findall(r"two_hosts: host[ab] md0: sent (\d+) bytes", out.stdout)
    assert len(sent) == 2 and all(int(b) > 16384 for b in sent), out.stdout
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"mdh{proc.pid}" not in namespaces, namespaces
    assert not [d for d in os.listdir(tempfile.gettempdir())
                if d.startswith(f"minidist-two-hosts-{proc.pid}-")]


def test_a_world_of_one_rank_is_a_usage_error():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "two_hosts.py"), "-n",
                          "1", "x.py"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage:" in out.stderr and "at least 2" in out.stderr
