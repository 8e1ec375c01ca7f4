"""What goes wrong between processes, each with its own exception.

Every error names who and what: the peer rank, the tag, the collective, and
what differed, so that a failing world explains itself in one message.
"""
from __future__ import annotations


class CommError(RuntimeError):
    """Base class of every communication error raised by minidist.comm."""


class CommTimeoutError(CommError, TimeoutError):
    """A send or receive waited longer than the group's timeout. Its message
    ends with ``TIMEOUT_HINT``: where that timeout is set."""


TIMEOUT_HINT = ("(a wait gives up after the group's timeout: 60 s unless "
                "init_process_group(timeout=SECONDS) sets another; minidist run --timeout "
                "SECONDS stops a whole run sooner, with the same table)")


class CollectiveMismatchError(CommError):
    """Ranks called different collectives, or the same one on different shapes,
    dtypes, ops or roots. Raised on every rank of the group."""


class MessageMismatchError(CommError):
    """A message arrived whose size or dtype differs from the posted receive."""


class NestedWorldError(CommError):
    """A rank of a world tried to start a world of its own: its processes cannot have
    children (they are daemonic, so that none outlives its parent)."""


class WorldAbortedError(CommError):
    """Another rank failed and the world is being stopped."""


class PeerFinishedError(CommError):
    """This rank waits on a peer that has already returned from the function the world
    runs: it finished early (or skipped a call the others make), so nothing will come."""


class PeerDiedError(CommError):
    """A rank of the collective (or the peer of the send or receive) this rank waits in
    has died (killed, ``os._exit``) in a world that keeps going without it
    (``World(fault_tolerant=True)``): nothing more will come from it. ``rank`` names
    it. Fault tolerance (parallel/fault_tolerance/) catches it and re-forms its group
    without the dead rank."""

    def __init__(self, message: str, rank: int = -1):
        self.rank = rank
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.rank))


class NotThisRankError(CommError):
    """A process asked to join a world as a rank that another process holds (a child
    that inherited ``MINIDIST_SHM`` and ``RANK`` from a rank)."""


class RankFailedError(CommError):
    """Raised in the parent when a rank of a world raised or died.

    ``rank`` is the first rank that failed on its own (not merely because the
    world was aborted), ``remote_traceback`` its traceback as text, and
    ``failures`` maps every rank that failed to ``(exception type name,
    traceback text)``.
    """

    def __init__(self, rank: int, exc_type: str, remote_traceback: str,
                 failures: dict[int, tuple[str, str]]):
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.failures = failures
        super().__init__(f"rank {rank} failed with {exc_type}:\n{remote_traceback}")

    def __reduce__(self):
        return (type(self), (self.rank, self.exc_type, self.remote_traceback, self.failures))


class WorldTimeoutError(CommError, TimeoutError):
    """Raised in the parent when a world did not finish within its time limit.

    No rank failed, so none is blamed: ``running`` lists the ranks still at
    work when they were stopped, and ``report`` what each was doing (the
    flight recorder's table, transport/flight.py)."""

    def __init__(self, what: str, timeout: float, running: list[int], report: str):
        self.what, self.timeout, self.running, self.report = what, timeout, running, report
        super().__init__(f"{what} did not finish within {timeout:g} s; ranks {running} were "
                         f"still running and were stopped\n{report}")

    def __reduce__(self):
        return (type(self), (self.what, self.timeout, self.running, self.report))
