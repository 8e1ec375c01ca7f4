"""One change of the quorum, as ``Manager(log=True)`` prints it and ``minidist run``
shows it (a line per replica that left, a line for the healing):

    step 7: replica 2 left (rank 2: SIGKILL), quorum 3 of 4
    step 9: replica 2 healed from replica 0 in 41 ms (151217 bytes sent)
"""
from __future__ import annotations

import signal
from typing import NamedTuple


class QuorumChange(NamedTuple):
    """One change of the quorum, seen from one rank."""
    step: int             # the step the new quorum starts at
    members: tuple        # the replicas in it
    total: int            # replicas in the world, spares included
    left: tuple           # (replica, ((rank, exit code), ...) of its dead ranks) per one gone
    healed: tuple         # replicas that received the state
    source: int           # the replica they received it from
    bytes: int            # healing bytes sent by this rank (0 unless it is the source)
    seconds: float        # how long forming it (and healing) took here
    began: float = 0.0    # time.monotonic() when this rank began forming it, and when
    ended: float = 0.0    # it was done (a healed one holding the state): one clock for
                          # every process of the machine (CLOCK_MONOTONIC; perf_counter's
                          # zero is per process), so ranks' stamps compare

    def __str__(self) -> str:
        lines = []
        quorum = f"quorum {len(self.members)} of {self.total}"
        for replica, dead in self.left:
            ranks = ", ".join(f"rank {r}: {how_it_ended(code)}" for r, code in dead)
            lines.append(f"step {self.step}: replica {replica} left ({ranks}), {quorum}")
        if self.healed:
            many = "s" * (len(self.healed) > 1)
            text = (f"step {self.step}: replica{many} {', '.join(map(str, self.healed))} "
                    f"healed from replica {self.source} in {self.seconds * 1e3:.0f} ms")
            lines.append(text + (f" ({self.bytes} bytes sent)" if self.bytes else ""))
        if not lines:
            lines.append(f"step {self.step}: {quorum}, replicas {list(self.members)}")
        return "\n".join(lines)


def how_it_ended(code: int | None) -> str:
    """"SIGKILL" for -9, "exit code 1" for 1."""
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return f"exit code {code}"
