"""Point-to-point transport: the interface every collective is written against.

A transport moves the bytes of an array from one rank to another::

    h = t.isend(arr, dst, tag, ctx)          # returns at once
    h = t.irecv(arr, src, tag, ctx)          # receive into arr (its shape, dtype)
    h = t.irecv(acc, src, tag, ctx, op=SUM)  # receive and reduce: acc = acc + incoming
    t.wait_all([h, ...], timeout, what)      # progress until all are done
    same = t.exchange(data, dst, inbox, src, tag, ctx)   # host bytes out, host bytes in

``ctx`` is the context of a process group: messages sent in one group are never
matched by receives in another. Within a context, messages between a pair of
ranks with the same tag arrive in the order they were sent (as in MPI).

``exchange`` is the step of the call check (collectives/check.py): send a block of host
bytes and receive one, where the incoming message may have another size than
expected (the ranks called different collectives): then it is dropped and
``exchange`` returns False instead of raising.

Two transports implement it: ``LocalTransport`` (shared memory between
processes on one machine, local.py) and ``MpiTransport`` (mpi4py, mpi.py).

Host memory: transports move host bytes. ``host_bytes`` gives the bytes of a
backend array (a view on NumPy and the guard backend, a device-to-host copy on
CuPy); received pieces are written into the backend array with ``from_host``,
which is again a view on the CPU backends and a host-to-device copy on CuPy.
"""
from __future__ import annotations

import time
from typing import Any

from minidist import backend
from minidist.backend import xp


class Handle:
    """A pending send or receive. ``wait()`` blocks until it is complete."""

    done: bool = False

    def wait(self, timeout: float | None = None) -> None:
        raise NotImplementedError

    def peer(self) -> int | None:
        """The rank this operation waits on (None: not one rank)."""
        return None

    def is_completed(self) -> bool:
        return self.done


class Transport:
    """The point-to-point interface (see the module docstring)."""

    rank: int
    world_size: int
    name: str
    single_copy = False  # may peers read this rank's arrays directly (cma.py)?
    peer_reads = False   # ... also over an emulated link (read_peer waits out the wire)?
    board = None         # each rank's slot that every peer reads in place (board.py), or None

    def link_bytes(self) -> Any:
        """The bytes this rank put on its emulated links (link.py's LinkBytes), or None
        on a transport without one."""
        return None

    def read_arrival(self, src: int, nbytes: int) -> int:
        """When a read of ``nbytes`` from rank ``src`` asked for now lands, in ns
        (an emulated link, link.py); 0 where bytes take no time on a wire."""
        return 0

    def read_peer(self, src: int, pid: int, address: int, out: Any, arrival: int = 0) -> bool:
        """Copy ``out.nbytes`` bytes at ``address`` in rank ``src`` (process ``pid``)
        into ``out`` once they have landed (``arrival``, from ``read_arrival``);
        False if the kernel refused (cma.py). Only where ``peer_reads``."""
        raise NotImplementedError(f"{type(self).__name__} cannot read its peers' memory")

    def isend(self, arr: Any, dst: int, tag: int, ctx: int = 0) -> Handle:
        raise NotImplementedError

    def irecv(self, arr: Any, src: int, tag: int, ctx: int = 0, op: Any = None) -> Handle:
        raise NotImplementedError

    def wait_all(self, handles: list, timeout: float, what: str = "",
                 abortable: bool = True) -> None:
        """Progress until every handle is done. Raise CommTimeoutError after
        ``timeout`` seconds without progress, and WorldAbortedError if another
        rank failed (unless ``abortable`` is False)."""
        raise NotImplementedError

    def sendrecv(self, send_arr: Any, dst: int, recv_arr: Any, src: int, tag: int,
                 ctx: int = 0, op: Any = None, timeout: float | None = None, what: str = "",
                 abortable: bool = True) -> None:
        """Send ``send_arr`` to ``dst`` while receiving (or, with ``op``,
        reducing) into ``recv_arr`` from ``src``; return when both are done.
        One step of a ring or of recursive doubling. Both are posted before
        either is waited on, so two neighbours that send to each other never
        wait for each other, whatever the size."""
        self.wait_all([self.isend(send_arr, dst, tag, ctx), self.irecv(recv_arr, src, tag, ctx, op)],
                      timeout, what, abortable)

    def recv(self, arr: Any, src: int, tag: int, ctx: int = 0, timeout: float | None = None,
             what: str = "") -> None:
        """Receive into ``arr`` from ``src`` and return when it is there: the
        blocking receive of a pipeline stage or a ring-attention step."""
        self.wait_all([self.irecv(arr, src, tag, ctx)], timeout, what)

    def exchange(self, data: Any, dst: int, inbox: Any, src: int, tag: int, ctx: int = 0,
                 timeout: float | None = None, what: str = "", abortable: bool = True) -> bool:
        """Send the host uint8 array ``data`` to ``dst`` while receiving one message
        from ``src`` into the host uint8 array ``inbox``. Return True if that
        message had exactly ``inbox.size`` bytes; otherwise drop it (``inbox`` is
        left as it was) and return False."""
        raise NotImplementedError

    def failed_ranks(self) -> list[int]:
        """The ranks that died in a world that goes on without them (only the local
        transport's launcher lets one go on: World(fault_tolerant=True)); here: none."""
        return []

    def drop_dead_peers(self) -> list[int]:
        """``failed_ranks()``, after dropping what this rank still holds for each (sends
        to it, receives from it, what it left in the channels), so that a replacement
        process may take a dead rank over (comm/transport/replace.py); here: nothing
        to drop."""
        return self.failed_ranks()

    def incarnation(self, rank: int) -> int:
        """How many times a replacement process took ``rank`` over (0: the first)."""
        return 0

    def exit_code(self, rank: int) -> int | None:
        """The exit code of dead ``rank`` (-9: SIGKILL), None while it lives."""
        return None

    def watch_deaths(self, ctx: int, ranks: list[int]) -> None:
        """Let the death of any of ``ranks`` (not only the group's own) end the waits
        of the calls of context ``ctx``: fault tolerance watches every rank of every
        replica in its quorum, as the partner of a dead rank stops too."""

    def forget(self, ctx: int) -> None:
        """Drop the sends of context ``ctx`` not yet begun and its receives not yet
        matched: its calls were given up (a peer died), and a send nobody will take
        would hold this rank at the end of the run (a message half sent still goes out,
        or its receiver would take the next one's pieces for the rest of it)."""

    def has_returned(self, rank: int) -> bool:
        """Has ``rank`` returned from the function this world runs, before this rank?"""
        return False

    def news_mark(self) -> int:
        """A mark to wait from (``wait_news``), read before looking at ``failed_ranks``
        and ``has_returned``: so that news after the look is never slept through."""
        return 0

    def wait_news(self, mark: int, timeout: float) -> None:
        """Sleep until a rank dies or returns after ``mark`` was read, or ``timeout``
        seconds; here, with nobody to say so: ``timeout`` seconds."""
        time.sleep(timeout)

    def record_begin(self, ctx: int, number: int, ranks: list[int], text: str,
                     now: float | None = None) -> None:
        """Note the call that starts at ``now`` (time.perf_counter(); None: read it
        there) in the flight recorder (flight.py); here: nowhere."""

    def record_end(self, now: float | None = None) -> None:
        """Note that the call noted last has finished (at ``now``, as above)."""

    def new_context(self, ranks: list[int]) -> int:
        """A fresh context for a group of ``ranks``. Called by every rank of the
        world, in the same order, like ``torch.distributed.new_group``."""
        raise NotImplementedError

    def abort(self, message: str) -> None:
        """Tell the other ranks that this one failed (best effort)."""

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------
# Host views of backend arrays.
# --------------------------------------------------------------------------

def host_bytes(arr: Any) -> Any:
    """The bytes of ``arr`` as a flat host uint8 array (C order)."""
    host = backend.to_host(arr)
    if not host.flags.c_contiguous:
        host = host.copy()  # a C-ordered snapshot of a strided array
    return host.reshape(-1).view(_UINT8)


def flat_target(arr: Any) -> tuple[Any, Any]:
    """(flat view to receive into, function to call when the receive is complete).

    A contiguous array is received into directly; a strided one through a
    contiguous staging array that is copied back at the end.
    """
    if arr.flags.c_contiguous:
        return arr.reshape(-1), None
    staging = xp.empty(arr.size, dtype=arr.dtype)

    def copy_back() -> None:
        arr[...] = staging.reshape(arr.shape)
    return staging, copy_back


def host_view(buffer: Any) -> Any:
    """A host uint8 array over a buffer (a memoryview of shared memory, bytes...)."""
    return backend.to_host(memoryview(buffer))


_UINT8 = host_view(bytearray(1)).dtype  # the dtype object, looked up once

_DTYPE_CODES: dict = {}


def dtype_code(dtype: Any) -> int:
    """A dtype as one int64 for a message header ('<f4' packed into 8 bytes)."""
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = int.from_bytes(dtype.str.encode().ljust(8, b"\0")[:8], "little", signed=True)
        _DTYPE_CODES[dtype] = code
    return code


def dtype_name(code: int) -> str:
    return code.to_bytes(8, "little", signed=True).rstrip(b"\0").decode(errors="replace")
