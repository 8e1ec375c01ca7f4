"""Every rank of one host killed mid-step (SIGKILL, all at once, as a machine that fails).

With hydra's default, mpiexec sees its ranks die and stops the job at once,
naming the host. With ``-disable-auto-cleanup`` (mpiexec does not stop the
survivors, as when a host falls off the network) the ranks of the other host
stop by themselves: their next wait goes TIMEOUT seconds without progress and
raises CommTimeoutError naming the ranks it had no word from and their host;
the uncaught error aborts the job. Either way nothing hangs (mpiexec ends well
within the bound given to it) and nothing is left in either host's /dev/shm
(MPICH's segment is unlinked once every rank has mapped it: transport/mpi.py).
"""
import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 5.0                       # the collective timeout the ranks run with
STEPS_BEFORE_KILL = 3


def _kill_host_b_mid_run(hosts, mpiexec_args):
    proc = hosts.popen([os.path.join(HERE, "killed.py"), str(TIMEOUT)], 4,
                       hosts="hosta:2,hostb:2", mpiexec_args=mpiexec_args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed, seen = [], 0
    try:
        for line in proc.stdout:            # bounded: killed.py's loop ends by itself
            seen += line.startswith("step ")
            if seen == STEPS_BEFORE_KILL:
                killed = hosts.kill_ranks("hostb", "killed.py")
                break
        out, err = proc.communicate(timeout=TIMEOUT + 60)   # a hang fails here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    assert len(killed) == 2, f"expected host b's 2 ranks to kill, got {killed}"
    return proc.returncode, out, err


@pytest.mark.parametrize("cleanup", ["mpiexec stops the job", "the survivors time out"])
def test_killing_one_hosts_ranks_stops_the_other_host_naming_them(hosts, cleanup):
    args = () if cleanup == "mpiexec stops the job" else ("-disable-auto-cleanup",)
    rc, out, err = _kill_host_b_mid_run(hosts, args)
    assert rc != 0, out + err
    assert "the loop ended" not in out
    if not args:
        both = out + err              # hydra writes its report to stdout
        assert "hostb" in both, both[-3000:]          # "... RUNNING AT hostb"
    else:
        assert "CommTimeoutError" in err or "CommError" in err, err[-3000:]
        named = re.findall(r"no word from (.*)", err)
        assert named, err[-3000:]
        for line in named:                  # host b's ranks are 2 and 3
            # the dead host is named; a survivor whose ring neighbour on host a waits
            # on host b had no word from that neighbour either, and names it too
            found = set(re.findall(r"rank (\d+) \(on (\w+)\)", line))
            assert found & {("2", "hostb"), ("3", "hostb")}, line
            assert found <= {("0", "hosta"), ("1", "hosta"), ("2", "hostb"),
                             ("3", "hostb")}, line
    assert hosts.shm("hosta") == [] and hosts.shm("hostb") == []
