"""The MPI transport: the same point-to-point interface on mpi4py's buffer API.

Under ``mpiexec -n N python script.py`` every process is a rank of
``MPI.COMM_WORLD``; ``init_process_group()`` sees MPI's environment and picks
this transport, so the collectives of collectives/api.py run unchanged, on one
machine or across many. Bytes move with ``Isend`` / ``Irecv`` on the host
buffers of the arrays (no pickling); a receive-and-reduce receives into a
temporary and then combines, as MPI has no fused form.

Each process group gets its own communicator (``Split`` of the world), which
keeps its messages apart, as the context does on the local transport. Waiting
polls ``Testall`` with the same spin-yield-sleep backoff, so a missing message
raises ``CommTimeoutError`` instead of hanging. An uncaught exception calls
``MPI_Abort``, which makes mpiexec stop every rank.

At start every rank all-gathers the host names (fixed-size bytes, never a pickle:
what a peer sends is data), from which ``topology`` finds
the nodes (topology.py): ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the node
layout of the hierarchical all-reduce and the device mesh.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

from minidist import backend
from minidist.comm.errors import TIMEOUT_HINT, CommError, CommTimeoutError, MessageMismatchError
from minidist.comm.transport import topology
from minidist.comm.transport.reduce_op import ReduceOp, combine_fn
from minidist.comm.transport.base import Handle, Transport, flat_target, host_bytes, host_view
from minidist.comm.transport.wait import SPIN_S, Backoff, free_polls


class _MpiHandle(Handle):
    def __init__(self, transport, request, what, on_done=None, expect=None, buf=None):
        self.transport, self.request, self.what = transport, request, what
        self.on_done, self.expect, self.buf = on_done, expect, buf
        self.status = None
        self.done = False
        self.world_peer = None    # the world rank at the other end, to name it on a timeout

    def wait(self, timeout: float | None = None) -> None:
        self.transport.wait_all([self], timeout)

    def describe(self) -> str:
        return self.what

    def test(self) -> bool:
        """Progress: True once the operation is complete (then finished)."""
        if not self.request.Test(self.status):
            return False
        self.finish()
        return True

    def finish(self) -> None:
        if self.expect is not None:
            got = self.status.Get_count()
            if got != self.expect:
                raise MessageMismatchError(
                    f"rank {self.transport.rank}: {self.what} got {got} bytes, "
                    f"expected {self.expect}")
        if self.on_done is not None:
            self.on_done()
        self.done = True
        self.buf = None


class _MpiBytesRecv(_MpiHandle):
    """A receive of host bytes that tolerates another size (for ``exchange``).

    MPI cannot receive a message into a smaller buffer, so the message is first
    found with a matched probe (``Improbe``, which also tells its size), then
    received into ``inbox`` if the size is right, or into a scratch buffer that
    is dropped if not.
    """

    def __init__(self, transport, comm, peer, tag, inbox, what):
        super().__init__(transport, None, what, buf=inbox)
        self.comm, self.peer, self.tag = comm, peer, tag
        self.status = transport.MPI.Status()
        self.mismatch = False

    def test(self) -> bool:
        if self.request is None:
            message = self.comm.Improbe(self.peer, self.tag, self.status)
            if message is None:
                return False
            byte = self.transport.MPI.BYTE
            if self.status.Get_count(byte) == self.buf.size:
                self.request = message.Irecv([self.buf, byte])
            else:
                self.mismatch = True
                message.Recv([host_view(bytearray(self.status.Get_count(byte))), byte])
                self.done = True
                return True
        return super().test()


class MpiTransport(Transport):
    """Point-to-point over MPI (see the module docstring)."""

    name = "mpi"

    def __init__(self, timeout: float = 60.0):
        from mpi4py import MPI
        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.rank = self.world.Get_rank()
        self.world_size = self.world.Get_size()
        self.timeout = timeout
        self._comms: dict[int, tuple[Any, dict]] = {
            0: (self.world, {r: r for r in range(self.world_size)})}
        self._next_ctx = 1
        _abort_on_uncaught_exception(self.world)
        # Which ranks share a machine (topology.py): every rank's host name, to all.
        hosts = all_host_names(self.world, MPI)
        _unlink_mpich_segments()       # every rank has mapped them: the all-gather returned
        self.topology = topology.from_hosts(hosts, topology.env_node_size())

    def _comm(self, ctx: int, peer: int) -> tuple[Any, int]:
        comm, ranks = self._comms[ctx]
        return comm, ranks[peer]

    def isend(self, arr: Any, dst: int, tag: int, ctx: int = 0) -> Handle:
        comm, peer = self._comm(ctx, dst)
        data = host_bytes(arr)
        request = comm.Isend([data, self.MPI.BYTE], dest=peer, tag=tag)
        h = _MpiHandle(self, request, f"send to rank {dst} (tag {tag})", buf=data)
        h.world_peer = dst
        return h

    def irecv(self, arr: Any, src: int, tag: int, ctx: int = 0,
              op: ReduceOp | None = None) -> Handle:
        comm, peer = self._comm(ctx, src)
        flat, copy_back = flat_target(arr)
        host = backend.to_host(flat) if backend.get_backend() != "cupy" else None
        if op is None and host is not None:
            # Receive straight into the array's own memory (a view on the CPU backends).
            target, on_done = host.view("uint8"), copy_back
        else:
            target = host_view(bytearray(arr.nbytes))
            combine = None if op is None else combine_fn(op)

            def on_done() -> None:
                incoming = backend.from_host(target.view(arr.dtype))
                if combine is None:
                    flat[...] = incoming
                else:
                    combine(flat, incoming, out=flat)
                if copy_back is not None:
                    copy_back()
        status = self.MPI.Status()
        request = comm.Irecv([target, self.MPI.BYTE], source=peer, tag=tag)
        h = _MpiHandle(self, request, f"recv from rank {src} (tag {tag})", on_done,
                       expect=arr.nbytes, buf=target)
        h.status, h.world_peer = status, src
        return h

    def wait_all(self, handles: list, timeout: float | None = None, what: str = "",
                 abortable: bool = True) -> None:
        timeout = self.timeout if timeout is None else timeout
        backoff = Backoff(SPIN_S, free_polls(self.world_size))   # wait.py
        pending = [h for h in handles if not h.done]
        while pending:
            still = [h for h in pending if not self._test(h)]
            if len(still) < len(pending):
                backoff.reset()
            pending = still
            if not pending or not backoff.idle():
                continue
            backoff.nap()   # no doorbell to sleep on: naps that grow
            if backoff.idle_seconds() > timeout:
                where = f" in {what}" if what else ""
                raise CommTimeoutError(
                    f"rank {self.rank}: waited {timeout:g} s{where} without progress on: "
                    + "; ".join(h.describe() for h in pending) + self._missing(pending)
                    + "\n" + TIMEOUT_HINT)

    def _test(self, h: Handle) -> bool:
        """``h.test()``, an MPI error (a peer whose connection broke) turned into a
        CommError that names the peer and its host."""
        try:
            return h.test()
        except self.MPI.Exception as e:
            raise CommError(f"rank {self.rank}: {h.describe()} failed: "
                            f"{e.Get_error_string()}{self._missing([h])}") from e

    def _missing(self, pending: list) -> str:
        """'; no word from rank 2 (on hostb), ...': the peers a timed-out wait waited for."""
        peers = sorted({h.world_peer for h in pending if h.world_peer is not None})
        if not peers:
            return ""
        hosts = self.topology.hosts
        return "; no word from " + ", ".join(f"rank {r} (on {hosts[r]})" for r in peers)

    def exchange(self, data: Any, dst: int, inbox: Any, src: int, tag: int, ctx: int = 0,
                 timeout: float | None = None, what: str = "", abortable: bool = True) -> bool:
        comm, peer = self._comm(ctx, dst)
        send = _MpiHandle(self, comm.Isend([data, self.MPI.BYTE], dest=peer, tag=tag),
                          f"send to rank {dst} (tag {tag})", buf=data)
        comm, peer = self._comm(ctx, src)
        recv = _MpiBytesRecv(self, comm, peer, tag, inbox, f"recv from rank {src} (tag {tag})")
        send.world_peer, recv.world_peer = dst, src
        self.wait_all([send, recv], timeout, what, abortable)
        return not recv.mismatch

    def new_context(self, ranks: list[int]) -> int:
        ctx = self._next_ctx
        self._next_ctx += 1
        member = self.rank in ranks
        color = 0 if member else self.MPI.UNDEFINED
        comm = self.world.Split(color, key=self.rank)
        if member:
            self._comms[ctx] = (comm, {r: i for i, r in enumerate(ranks)})
        return ctx

    def abort(self, message: str) -> None:
        print(f"rank {self.rank}: {message}", file=sys.stderr, flush=True)
        self.world.Abort(1)

    def close(self) -> None:
        for ctx, (comm, _) in list(self._comms.items()):
            if ctx != 0:
                comm.Free()
        self._comms = {}


HOST_BYTES = 256    # a host name on the wire: UTF-8, zero-padded (MPI_MAX_PROCESSOR_NAME)


def host_name_bytes(name: str) -> bytes:
    """``name`` as exactly ``HOST_BYTES`` bytes: what each rank sends."""
    data = name.encode("utf-8", errors="backslashreplace")[:HOST_BYTES]
    return data.ljust(HOST_BYTES, b"\0")


def host_names_from(table: bytes, world_size: int) -> list[str]:
    """The host names of an all-gathered table of ``host_name_bytes`` (a name that is
    not UTF-8 is kept, its odd bytes escaped: it is only compared and printed)."""
    return [table[r * HOST_BYTES:(r + 1) * HOST_BYTES].rstrip(b"\0")
            .decode("utf-8", errors="backslashreplace") for r in range(world_size)]


def all_host_names(comm: Any, MPI: Any) -> list[str]:
    """Every rank's host name, to every rank, as fixed-size bytes: ``allgather`` of a
    Python object would unpickle what each peer sends, and a peer's bytes are data."""
    table = bytearray(HOST_BYTES * comm.Get_size())
    comm.Allgather([host_name_bytes(MPI.Get_processor_name()), MPI.BYTE], [table, MPI.BYTE])
    return host_names_from(bytes(table), comm.Get_size())


def _unlink_mpich_segments() -> None:
    """Unlink the /dev/shm segments MPICH mapped into this process.

    MPICH unlinks its shared-memory segment at ``MPI_Finalize``: ranks that are
    killed leave it in /dev/shm. Once every rank of the host has mapped it (all
    of them have passed ``MPI_Init`` when an all-gather over the world returns),
    its name is no longer needed; the memory stays until the last rank unmaps it
    or dies, as with the local transport's segment (shm.py)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps
                     if "/dev/shm/mpich" in line and not line.rstrip().endswith("(deleted)")}
    except OSError:          # no /proc: not Linux, nothing mapped from /dev/shm to tidy
        return
    for path in paths:
        try:
            os.unlink(path)
        except OSError:      # another rank of this host unlinked it first
            pass


def _abort_on_uncaught_exception(world) -> None:
    """An exception that escapes the script brings the whole MPI job down."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb) -> None:
        sys.stderr.write(f"rank {world.Get_rank()} failed:\n"
                         + "".join(traceback.format_exception(exc_type, exc, tb)))
        sys.stderr.flush()
        if issubclass(exc_type, KeyboardInterrupt):
            previous(exc_type, exc, tb)
        # mpiexec forwards our stderr asynchronously and MPI_Abort kills the job at
        # once: give the traceback a moment to get out first.
        time.sleep(0.3)
        world.Abort(1)
    sys.excepthook = hook
