"""Process groups: who talks to whom, and the default world.

A ``ProcessGroup`` is an ordered list of global ranks plus a transport context,
so that messages of one group never mix with another's. Ranks inside a group
are numbered 0..size-1 in increasing global rank (as in torch.distributed).
Point-to-point calls on a group take group ranks and count every byte and
message they move (``group.stats``); the collectives are written on top of them.

``init_process_group()`` picks the transport from the environment:

- ``MINIDIST_SHM`` set (by ``minidist.launch`` / ``minidist run``): the local
  shared-memory transport, rank from ``RANK``;
- ``PMI_RANK`` / ``OMPI_COMM_WORLD_RANK`` set (under ``mpiexec``): MPI, which
  also finds the nodes from the host names and sets LOCAL_RANK, LOCAL_WORLD_SIZE
  and GROUP_RANK as torchrun would (transport/topology.py);
- neither: a world of one process, so a script also runs on its own.
"""
from __future__ import annotations

import atexit
import os
from typing import Any

from minidist.comm.collectives.stats import CommStats
from minidist.comm.transport import shm, topology
from minidist.comm.transport.base import Handle, Transport
from minidist.trace import recorder as trace

DEFAULT_TIMEOUT = 60.0       # seconds a wait may go without progress before it fails
USER_TAG_LIMIT = 1 << 24     # user tags are 0 .. 2**24 - 1
COLLECTIVE_TAG = 1 << 24     # collectives use COLLECTIVE_TAG + (call number mod 2**16)

_MPI_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class ProcessGroup:
    """A set of ranks that communicate among themselves (see module docstring)."""

    def __init__(self, transport: Transport, ranks: list[int], ctx: int,
                 timeout: float = DEFAULT_TIMEOUT, check: bool = True):
        self.transport = transport
        self.group_desc = ""                  # torch's; a DeviceMesh's group: "mesh_<dim name>"
        self.ranks = list(ranks)              # group rank i is global rank ranks[i]
        self.ctx = ctx
        self.timeout = timeout
        self.check = check                    # verify collective calls match (collectives/check.py)
        self.rank = self.ranks.index(transport.rank)
        self.size = len(self.ranks)
        self.stats = CommStats()
        self.small_plans: dict = {}           # plans and check tables: check.py, cached_plan
        self.direct_reads: bool | None = None  # may ranks read each other? (collectives/direct.py)
        self._calls = 0

    def __repr__(self) -> str:
        return f"ProcessGroup(ranks={self.ranks}, rank={self.rank}, transport={self.transport.name})"

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def group_rank(self, global_rank: int) -> int:
        if global_rank not in self.ranks:
            raise ValueError(f"rank {global_rank} is not in group {self.ranks}")
        return self.ranks.index(global_rank)

    @property
    def calls(self) -> int:
        """Collectives called on this group so far (the last one's number)."""
        return self._calls

    def next_collective_tag(self) -> int:
        """Each collective call gets its own tag (all ranks call collectives in the same order)."""
        self._calls += 1
        return COLLECTIVE_TAG + self._calls % (1 << 16)

    # -- point to point, in group ranks ---------------------------------------
    def isend(self, arr: Any, dst: int, tag: int) -> Handle:
        self.stats.counted.bytes_sent += arr.nbytes
        self.stats.counted.msgs_sent += 1
        if trace.active is not None:   # the flow arrow to the receive (trace/recorder.py)
            trace.active.sent(self.transport.rank, self.ranks[dst], self.ctx, tag, arr.nbytes)
        return self.transport.isend(arr, self.ranks[dst], tag, self.ctx)

    def irecv(self, arr: Any, src: int, tag: int, op: Any = None) -> Handle:
        """Receive into ``arr``; with ``op``, reduce into it instead (arr = op(arr, incoming))."""
        self.stats.counted.bytes_recv += arr.nbytes
        self.stats.counted.msgs_recv += 1
        handle = self.transport.irecv(arr, self.ranks[src], tag, self.ctx, op)
        if trace.active is not None:
            trace.active.receiving(handle, self.ranks[src], self.transport.rank, self.ctx, tag)
        return handle

    def wait(self, handles: list, what: str = "", abortable: bool = True) -> None:
        self.transport.wait_all(handles, self.timeout, what, abortable)
        if trace.active is not None:
            trace.active.landed()

    def sendrecv(self, send_arr: Any, dst: int, recv_arr: Any, src: int, tag: int,
                 op: Any = None, what: str = "", abortable: bool = True) -> None:
        """Send to ``dst`` and receive from ``src`` at the same time.

        Both are posted before either is waited on: with blocking calls, two
        neighbours that both send first would wait for each other forever once
        the message no longer fits in the channel.
        """
        self.stats.counted.bytes_sent += send_arr.nbytes
        self.stats.counted.bytes_recv += recv_arr.nbytes
        self.stats.counted.msgs_sent += 1
        self.stats.counted.msgs_recv += 1
        if trace.active is not None:
            trace.active.sent(self.transport.rank, self.ranks[dst], self.ctx, tag, send_arr.nbytes)
        self.transport.sendrecv(send_arr, self.ranks[dst], recv_arr, self.ranks[src], tag,
                                self.ctx, op, self.timeout, what, abortable)
        if trace.active is not None:
            trace.active.exchanged(self.ranks[src], self.transport.rank, self.ctx, tag)


    def exchange(self, data: Any, dst: int, inbox: Any, src: int, tag: int, what: str = "",
                 abortable: bool = True) -> bool:
        """Send host bytes to ``dst`` while receiving host bytes from ``src``: one
        step of the call check (collectives/check.py). False if the incoming message had
        another size than ``inbox`` (then dropped). Not counted in ``stats``:
        the caller counts what it carried besides the check."""
        if trace.active is not None:
            trace.active.sent(self.transport.rank, self.ranks[dst], self.ctx, tag, data.nbytes)
        same = self.transport.exchange(data, self.ranks[dst], inbox, self.ranks[src], tag,
                                       self.ctx, self.timeout, what, abortable)
        if trace.active is not None:
            trace.active.exchanged(self.ranks[src], self.transport.rank, self.ctx, tag)
        return same


class _NonMember:
    """What ``new_group`` returns on a rank outside the group (torch's NON_GROUP_MEMBER)."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonMember()

_state: dict[str, Any] = {"world": None, "owned_segment": None}


def init_process_group(backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                       check: bool = True) -> ProcessGroup:
    """Join the world of processes this one belongs to and return the world group.

    ``backend`` is the transport, named like torch's: ``"shm"`` (processes on
    this machine), ``"mpi"`` (under mpiexec), or None to read the environment.
    ``timeout`` is how long a send or receive may wait without progress before
    it raises ``CommTimeoutError``; ``check=False`` skips the check that every
    rank called the same collective on the same shape and dtype.
    """
    if _state["world"] is not None:
        raise RuntimeError("init_process_group was already called in this process; "
                           "call destroy_process_group() first")
    env = os.environ
    if backend is None:
        if "MINIDIST_SHM" in env:
            backend = "shm"
        elif any(k in env for k in _MPI_ENV):
            backend = "mpi"
        else:
            backend = "self"
    if backend == "mpi":
        try:
            from minidist.comm.transport.mpi import MpiTransport
            transport: Transport = MpiTransport(timeout)
        except ImportError as e:
            raise ImportError("running under mpiexec needs mpi4py: "
                              "pip install 'minidist[mpi]'") from e
    elif backend == "shm" and "MINIDIST_SHM" in env:
        from minidist.comm.transport.local import LocalTransport
        transport = LocalTransport(env["MINIDIST_SHM"], int(env.get("RANK", "0")), timeout)
    elif backend in ("self", "shm"):
        # A world of one: its own small segment, unlinked when the group is destroyed.
        from minidist.comm.transport.local import LocalTransport
        seg = shm.create(1, nslots=4, slot_bytes=1 << 16)
        _state["owned_segment"] = seg
        transport = LocalTransport(seg.name, 0, timeout)
    else:
        raise ValueError(f"unknown backend {backend!r}: choose 'shm', 'mpi' or None")
    if backend == "mpi":
        topology.export_env(transport.topology, transport.rank)
    _state["world"] = ProcessGroup(transport, list(range(transport.world_size)), 0, timeout, check)
    atexit.register(destroy_process_group)
    trace.start_from_env(transport.rank, transport.world_size)  # MINIDIST_TRACE=run.json
    if trace.active is not None and backend == "mpi":   # clocks of other machines (clock.py)
        from minidist.comm.collectives.clock import clock_offset
        trace.active.note_rank(transport.rank, transport.world_size, clock_offset(_state["world"]))
    return _state["world"]


def launched() -> bool:
    """Was this process started as one rank of a world, by ``minidist run``,
    ``minidist.launch`` or ``mpiexec``? (torch: ``is_torchelastic_launched``.)
    A script can then join that world instead of starting its own."""
    return "MINIDIST_SHM" in os.environ or any(k in os.environ for k in _MPI_ENV)


def is_initialized() -> bool:
    return _state["world"] is not None


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the world: stop background work, close the transport, free shared memory."""
    if group is not None and group is not _state["world"]:
        return  # sub-groups own nothing of their own
    world = _state["world"]
    if world is None:
        return
    from minidist.comm.collectives import work
    work.shutdown()
    from minidist.trace.session import finish
    finish()   # a trace being recorded: this rank's part is complete (trace/session.py)
    _state["world"] = None
    world.transport.close()
    seg = _state["owned_segment"]
    if seg is not None:
        _state["owned_segment"] = None
        name = seg.name
        shm.close(seg)
        shm.unlink(name)
    atexit.unregister(destroy_process_group)


def world_group() -> ProcessGroup:
    world = _state["world"]
    if world is None:
        raise RuntimeError("the default process group is not initialised: "
                           "call minidist.distributed.init_process_group() first")
    return world


def resolve(group: ProcessGroup | None) -> ProcessGroup:
    """``group=None`` means the world; a non-member cannot take part."""
    if group is None:
        return world_group()
    if group is NON_GROUP_MEMBER:
        raise ValueError(f"rank {world_group().rank} is not a member of this group")
    return group


def new_group(ranks: list[int] | None = None, timeout: float | None = None) -> Any:
    """A group of ``ranks`` (global ranks). Every rank of the world must call it, in
    the same order; ranks outside the group get ``NON_GROUP_MEMBER``."""
    world = world_group()
    ranks = sorted(set(range(world.size) if ranks is None else ranks))
    if not ranks or ranks[0] < 0 or ranks[-1] >= world.size:
        raise ValueError(f"new_group: ranks {ranks} outside a world of {world.size}")
    ctx = world.transport.new_context(ranks)
    if world.transport.rank not in ranks:
        return NON_GROUP_MEMBER
    return ProcessGroup(world.transport, ranks, ctx,
                        world.timeout if timeout is None else timeout, world.check)


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (the world if None); -1 if not a member."""
    if group is NON_GROUP_MEMBER:
        return -1
    return resolve(group).rank


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its machine (``LOCAL_RANK``, which ``minidist run``
    sets and ``init_process_group`` sets under MPI); ``fallback_rank`` if unset."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return fallback_rank
    raise RuntimeError("LOCAL_RANK is not set: start under minidist run or mpiexec "
                       "(after init_process_group), or pass fallback_rank")


def get_topology() -> "topology.Topology | None":
    """The world's nodes: found under MPI, declared by World(node_size=...) on a
    local world, None for a local world of one level (transport/topology.py)."""
    return getattr(world_group().transport, "topology", None)


def get_link_bytes() -> Any:
    """Bytes this rank put on the emulated links, inside its node and between nodes, in
    every group (transport/link.py's LinkBytes); None without an emulated link."""
    return world_group().transport.link_bytes()


def get_world_size(group: ProcessGroup | None = None) -> int:
    if group is NON_GROUP_MEMBER:
        return -1
    return resolve(group).size


def get_stats(group: ProcessGroup | None = None) -> CommStats:
    """Bytes and messages this rank moved in ``group`` (``.last``: the last collective)."""
    return resolve(group).stats
