"""Two hosts made of this machine, and one MPI world across them (Linux, as root).

    sudo python scripts/two_hosts.py -n 4 demos/19_topology.py        # 2 ranks on each host
    sudo python scripts/two_hosts.py -n 4 --hosts hosta,hostb demos/02_collectives.py

Each host is a network namespace with its own host name (a UTS namespace), its
own /dev/shm (a private tmpfs in a mount namespace) and one end of a veth pair,
``md0``, with an address only there (10.77.0.1 and 10.77.0.2; /etc/hosts inside
names them). ``mpiexec`` runs on host a; in place of ssh its launcher enters
the host's namespaces with ``nsenter``, so hydra's proxy on host b connects
back to mpiexec over the veth. MPICH moves bytes between hosts with libfabric's
TCP provider on ``md0`` (``MPICH_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=md0``)
and through its shared memory inside a host, as on two real machines. The
bytes that crossed are read from each end's counters,
``/sys/class/net/md0/statistics/{tx,rx}_bytes``, and printed at the end.

Everything stops by itself: each host is held by a ``sleep`` of ``--lifetime``
seconds, mpiexec runs under a time limit, and ``close()`` kills every process
left in the two namespaces and deletes them (the veth goes with them), whatever
happened. Names carry this process's id (``mdh<pid>a``): a later start deletes
the namespaces of a run whose process is gone (a SIGKILLed test).

``TwoHosts`` is also what tests/comm/across_hosts/ use::

    with TwoHosts() as hosts:
        out = hosts.mpiexec(["demos/19_topology.py"], n=4)
        hosts.counters()        # {'hosta': (tx, rx), 'hostb': (tx, rx)}
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PREFIX = "mdh"                              # namespace and veth names: mdh<pid>a, mdh<pid>b
STATE_PREFIX = "minidist-two-hosts-"        # its folder: <tmp>/minidist-two-hosts-<pid>-...
HOSTS = ("hosta", "hostb")
ADDRESSES = ("10.77.0.1", "10.77.0.2")
IFACE = "md0"                               # the veth end inside each host
TOOLS = ("ip", "nsenter", "unshare", "mount")
MPI_ENV = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": IFACE,
           "HYDRA_IFACE": IFACE}

LAUNCHER = """#!/bin/sh
# hydra's ssh launcher calls: launcher [options] host command...; run the command on that host.
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
exec nsenter -t "$(cat {state}/pid_$host)" --uts --mount --net -- sh -c "$*"
"""


class TwoHostsUnavailable(RuntimeError):
    """Two hosts cannot be made here (not root, no iproute2, no namespaces)."""


def why_unavailable() -> str | None:
    """The reason two hosts cannot be made on this machine, or None."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "making network namespaces needs root (run as root, or under sudo)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 util-linux mount)"
    if shutil.which("mpiexec") is None:
        return "mpiexec not on PATH (pip install 'minidist[mpi]')"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise TwoHostsUnavailable(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_namespace(name: str) -> None:
    """Kill every process inside namespace ``name`` (ours: we made it), then delete it."""
    pids = _run("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _run("ip", "netns", "delete", name, check=False)


def clean_leftovers() -> list[str]:
    """Delete the namespaces and folders of earlier runs whose process is gone; return
    their names."""
    listed = _run("ip", "netns", "list", check=False).stdout.split("\n")
    gone = []
    for line in listed:
        m = re.match(rf"({PREFIX}(\d+)[ab])\b", line.strip())
        if m and not _pid_alive(int(m.group(2))):
            _remove_namespace(m.group(1))
            gone.append(m.group(1))
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        m = re.match(rf"{STATE_PREFIX}(\d+)-", name)
        if m and not _pid_alive(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
            gone.append(name)
    return gone


class TwoHosts:
    """Two hosts of this machine joined by a veth pair (see the module docstring)."""

    def __init__(self, lifetime: float = 600.0):
        self.lifetime = lifetime
        tag = f"{PREFIX}{os.getpid()}"
        self.namespaces = (f"{tag}a", f"{tag}b")
        self.state = ""
        self.holders: list[subprocess.Popen] = []

    def __enter__(self) -> "TwoHosts":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        reason = why_unavailable()
        if reason:
            raise TwoHostsUnavailable(reason)
        clean_leftovers()
        for ns in self.namespaces:          # a leftover of this very pid (reused)
            _remove_namespace(ns)
        self.state = tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{os.getpid()}-")
        with open(os.path.join(self.state, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.writelines(f"{addr} {host}\n" for addr, host in zip(ADDRESSES, HOSTS))
        launcher = os.path.join(self.state, "launcher")
        with open(launcher, "w") as f:
            f.write(LAUNCHER.replace("{state}", self.state))
        os.chmod(launcher, 0o755)
        a, b = self.namespaces
        for ns in self.namespaces:
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for ns, addr in zip(self.namespaces, ADDRESSES):
            _run("ip", "link", "set", ns, "netns", ns)
            _run("ip", "-n", ns, "link", "set", ns, "name", IFACE)
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            _run("ip", "-n", ns, "link", "set", IFACE, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        for ns, host in zip(self.namespaces, HOSTS):
            self.holders.append(self._hold(ns, host))
        deadline = time.monotonic() + 20
        while not all(os.path.exists(self._pid_file(h)) for h in HOSTS):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.holders):
                raise TwoHostsUnavailable("a host did not come up: " + " ".join(
                    p.stderr.read() if p.poll() is not None else "" for p in self.holders))
            time.sleep(0.05)

    def _pid_file(self, host: str) -> str:
        return os.path.join(self.state, f"pid_{host}")

    def _hold(self, ns: str, host: str) -> subprocess.Popen:
        """A process that holds the host's UTS and mount namespaces for ``lifetime`` s."""
        inside = (f"echo {host} > /proc/sys/kernel/hostname && mount -t tmpfs -o size=1g tmpfs /dev/shm && "
                  f"mount --bind {self.state}/hosts /etc/hosts && "
                  f"echo $$ > {self._pid_file(host)}.tmp && "
                  f"mv {self._pid_file(host)}.tmp {self._pid_file(host)} && "
                  f"exec sleep {int(self.lifetime)}")
        return subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "--mount",
                                 "--fork", "--propagation", "private", "sh", "-c", inside],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    def enter(self, host: str) -> list[str]:
        """The command prefix that runs a command on ``host``."""
        with open(self._pid_file(host)) as f:
            pid = f.read().strip()
        return ["nsenter", "-t", pid, "--uts", "--mount", "--net", "--"]

    def popen(self, argv: list[str], n: int, hosts: str = "hosta:2,hostb:2",
              env: dict | None = None, mpiexec_args: tuple = (), **kw) -> subprocess.Popen:
        """Start ``mpiexec -n n python argv...`` on host a, ranks placed by ``hosts``."""
        full = {**os.environ, **MPI_ENV, **(env or {})}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MINIDIST_SHM"):
            full.pop(k, None)                 # not a minidist run world
        cmd = [*self.enter(HOSTS[0]), shutil.which("mpiexec"), "-launcher", "ssh",
               "-launcher-exec", os.path.join(self.state, "launcher"), "-hosts", hosts,
               "-n", str(n), "-wdir", os.getcwd(), *mpiexec_args, sys.executable, *argv]
        return subprocess.Popen(cmd, env=full, start_new_session=True, text=True, **kw)

    def mpiexec(self, argv: list[str], n: int, timeout: float = 120.0,
                **kw) -> subprocess.CompletedProcess:
        """Run ``popen`` to the end (killed after ``timeout`` s); its output captured."""
        proc = self.popen(argv, n, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\ntwo_hosts: mpiexec killed after {timeout:g} s"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def counters(self) -> dict[str, tuple[int, int]]:
        """host -> (tx_bytes, rx_bytes) of its end of the veth."""
        out = {}
        for ns, host in zip(self.namespaces, HOSTS):
            stats = f"/sys/class/net/{IFACE}/statistics"
            got = _run("ip", "netns", "exec", ns, "cat", f"{stats}/tx_bytes",
                       f"{stats}/rx_bytes").stdout.split()
            out[host] = (int(got[0]), int(got[1]))
        return out

    def shm(self, host: str) -> list[str]:
        """What is in ``host``'s /dev/shm."""
        return sorted(_run(*self.enter(host), "ls", "-A", "/dev/shm").stdout.split())

    def kill_ranks(self, host: str, pattern: str) -> list[int]:
        """SIGKILL the processes on ``host`` whose command line contains ``pattern``
        (the ranks, all at once, as a machine that fails); return their pids. Every
        command line is read before the first kill: once one rank dies, mpiexec may
        stop the others of its host before this loop reaches them (they died all the
        same, and are counted)."""
        ns = self.namespaces[HOSTS.index(host)]
        ranks = []
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pattern in cmdline and "mpiexec" not in cmdline and "hydra" not in cmdline:
                ranks.append(int(pid))
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass                # stopped by mpiexec after the first kill
        return ranks

    def close(self) -> None:
        """Kill what runs in the two hosts, delete the namespaces and the state folder."""
        for ns in self.namespaces:
            _remove_namespace(ns)
        for p in self.holders:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            if p.stderr:
                p.stderr.close()
        self.holders = []
        if self.state:
            shutil.rmtree(self.state, ignore_errors=True)
            self.state = ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=4, help="ranks in all (default 4)")
    parser.add_argument("--hosts", default=None,
                        help="mpiexec's host list (default hosta:N/2,hostb:N/2: blocked)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds before mpiexec is killed (default 300)")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args()
    if ns.n < 2:
        parser.error(f"-n must be at least 2 (one rank on each host), got {ns.n}")
    hosts = ns.hosts or f"hosta:{(ns.n + 1) // 2},hostb:{ns.n // 2}"
    reason = why_unavailable()
    if reason:
        print(f"two_hosts: cannot make two hosts here: {reason}", file=sys.stderr)
        return 2
    with TwoHosts(lifetime=ns.timeout + 60) as two:
        before = two.counters()
        proc = two.popen([ns.script, *ns.args], ns.n, hosts)
        try:
            rc = proc.wait(timeout=ns.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            print(f"two_hosts: mpiexec killed after {ns.timeout:g} s", file=sys.stderr)
            rc = 1
        after = two.counters()
        for host in HOSTS:
            tx, rx = (a - b for a, b in zip(after[host], before[host]))
            print(f"two_hosts: {host} {IFACE}: sent {tx} bytes, received {rx} bytes")
    return rc


if __name__ == "__main__":
    sys.exit(main())
