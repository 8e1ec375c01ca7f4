"""The same collective checks on the MPI transport, under mpiexec (-n 2 and -n 4).

Needs the ``mpi`` extra (mpi4py and the ``mpich`` wheel, which puts ``mpiexec``
on PATH). Skipped only when those are absent; CI installs them.
"""
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("mpi4py", reason="the MPI tests need: pip install 'minidist[mpi]'")
MPIEXEC = shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not on PATH")
HERE = os.path.dirname(os.path.abspath(__file__))


def _mpich_segments():
    try:
        return {f for f in os.listdir("/dev/shm") if f.startswith("mpich_shm_")}
    except FileNotFoundError:
        return set()


def _mpiexec(n, *args, timeout=60):
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "MINIDIST_SHM"):  # not a minidist run world
        env.pop(k, None)
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_match_numpy_reference_on_mpi(n):
    out = _mpiexec(n, os.path.join(HERE, "mpi_collectives.py"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"collective cases passed on {n} ranks" in out.stdout


@pytest.fixture
def mpich_cleanup():
    """MPI_Abort leaves MPICH's own shared-memory segment behind (not ours:
    minidist creates none under MPI); remove what the aborted job left."""
    before = _mpich_segments()
    yield
    for name in _mpich_segments() - before:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass


def test_a_failing_rank_aborts_the_mpi_job(tmp_path, mpich_cleanup):
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent("""
        import minidist.distributed as dist
        dist.init_process_group()
        if dist.get_rank() == 1:
            raise ValueError("rank 1 gives up")
        dist.barrier()
    """))
    out = _mpiexec(2, str(script), timeout=30)
    assert out.returncode != 0
    assert "rank 1 failed" in out.stderr and "rank 1 gives up" in out.stderr


def test_a_missing_send_times_out_on_mpi(tmp_path, mpich_cleanup):
    script = tmp_path / "timeout.py"
    script.write_text(textwrap.dedent("""
        import minidist.distributed as dist
        from minidist.backend import xp
        dist.init_process_group(timeout=1.0)
        if dist.get_rank() == 0:
            dist.recv(xp.zeros(3), src=1, tag=4)
    """))
    out = _mpiexec(2, str(script), timeout=30)
    assert out.returncode != 0
    assert "CommTimeoutError" in out.stderr and "recv from rank 1 (tag 4)" in out.stderr


DEMO_19 = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "demos",
                       "19_topology.py")


@pytest.mark.parametrize("node_size", [None, 2])
def test_the_topology_is_found_under_mpiexec(node_size):
    """One host: one node of 4 ranks, or, with MINIDIST_NODE_SIZE=2, two nodes of 2
    on it; LOCAL_RANK / LOCAL_WORLD_SIZE follow, and the hierarchical all-reduce
    runs on the nodes found (demo 19 checks its sum and its bytes between nodes)."""
    extra = {} if node_size is None else {"MINIDIST_NODE_SIZE": str(node_size)}
    os.environ.update(extra)
    try:
        out = _mpiexec(4, DEMO_19)
    finally:
        for k in extra:
            os.environ.pop(k)
    assert out.returncode == 0, out.stdout + out.stderr
    local = node_size or 4
    for rank in range(4):
        want = (f"rank {rank}: host {socket.gethostname()}, node {rank // local} of "
                f"{4 // local}, local rank {rank % local} of {local} (found from host names); "
                f"LOCAL_RANK={rank % local} LOCAL_WORLD_SIZE={local}")
        assert want in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith(": ok"), out.stdout


def test_a_node_size_that_disagrees_with_the_hosts_is_an_error(mpich_cleanup):
    os.environ["MINIDIST_NODE_SIZE"] = "3"
    try:
        out = _mpiexec(4, DEMO_19, timeout=30)
    finally:
        os.environ.pop("MINIDIST_NODE_SIZE")
    assert out.returncode != 0
    assert ("MINIDIST_NODE_SIZE=3 disagrees with the hosts found (ranks per host: "
            f"{socket.gethostname()}: 4)") in out.stderr, out.stderr


@settings(max_examples=100, deadline=None)
@given(names=st.lists(st.text(st.characters(blacklist_characters="\0",
                                            blacklist_categories=("Cs",)), max_size=60),
                      min_size=1, max_size=5))
def test_host_names_travel_as_fixed_size_bytes(names):
    """Each rank sends exactly HOST_BYTES bytes (no pickle), and the all-gathered table
    reads back as the names (60 characters are at most 240 bytes of UTF-8)."""
    from minidist.comm.transport.mpi import HOST_BYTES, host_name_bytes, host_names_from
    table = b"".join(host_name_bytes(n) for n in names)
    assert len(table) == HOST_BYTES * len(names)
    assert host_names_from(table, len(names)) == names
    assert host_names_from(host_name_bytes("h" * 1000), 1) == ["h" * HOST_BYTES]


def test_the_mpi_transport_sends_no_python_objects():
    """mpi4py's lowercase methods (allgather, bcast, send, recv, ...) pickle and
    unpickle; the transport calls only the buffer ones."""
    import ast
    import minidist.comm.transport.mpi as mpi
    tree = ast.parse(open(mpi.__file__).read())
    pickling = {"allgather", "bcast", "gather", "scatter", "send", "recv", "isend", "irecv",
                "sendrecv", "allreduce", "reduce", "alltoall", "exscan", "scan"}
    calls = [node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in pickling
             and getattr(node.func.value, "attr", getattr(node.func.value, "id", "")) in
             ("world", "comm", "COMM_WORLD")]
    assert calls == [], calls
