"""What a rank moved: bytes and messages, in total, per collective, and in the last one.

Every collective adds what it sent and received (``group.stats``; ``dist.get_stats()``),
so a test can check the ring's 2(N-1)/N * M per rank and a bench can print
the bytes beside the time. A call of the latency path knows its counts
beforehand and adds them in one step (``add``); every other call takes a
snapshot before and records the difference after (``record``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

_COUNTERS = ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv")


@dataclass
class CommStats:
    """Bytes and messages this rank moved: in total, per collective, and in the
    last collective (``last``: a dict with the collective's name, its call
    fields, and the four counters)."""
    bytes_sent: int = 0
    bytes_recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0
    inter_node_bytes: int = 0  # sent between nodes by the hierarchical all-reduce
    _last: tuple = ("", {}, (0, 0, 0, 0))
    _totals: dict = field(default_factory=dict)  # name -> [calls, *counters, seconds]

    def snapshot(self) -> tuple[int, int, int, int]:
        return (self.bytes_sent, self.bytes_recv, self.msgs_sent, self.msgs_recv)

    def record(self, name: str, before: tuple, info: dict, seconds: float = 0.0) -> None:
        """Note what the collective ``name`` moved since ``before`` (a snapshot), and
        how long it ran. Kept as plain numbers: this runs on every call, dicts are
        built on demand."""
        delta = (self.bytes_sent - before[0], self.bytes_recv - before[1],
                 self.msgs_sent - before[2], self.msgs_recv - before[3])
        self._note(name, info, delta, seconds)

    def add(self, name: str, info: dict, delta: tuple, seconds: float = 0.0) -> None:
        """``record`` for a call that knows what it moves beforehand (a plan of the
        latency path): ``delta`` = (bytes_sent, bytes_recv, msgs_sent, msgs_recv)."""
        self.bytes_sent += delta[0]
        self.bytes_recv += delta[1]
        self.msgs_sent += delta[2]
        self.msgs_recv += delta[3]
        self._note(name, info, delta, seconds)

    def _note(self, name: str, info: dict, delta: tuple, seconds: float) -> None:
        self._last = (name, info, delta)
        totals = self._totals.get(name)
        if totals is None:
            totals = self._totals[name] = [0, 0, 0, 0, 0, 0.0]
        totals[0] += 1
        totals[1] += delta[0]
        totals[2] += delta[1]
        totals[3] += delta[2]
        totals[4] += delta[3]
        totals[5] += seconds

    @property
    def last(self) -> dict:
        name, info, delta = self._last
        if not name:
            return {}
        return dict(collective=name, **info, **dict(zip(_COUNTERS, delta)))

    @property
    def per_collective(self) -> dict:
        """name -> calls, the four counters, and ``seconds``: how long its calls ran
        in all (an async call runs in the background, so its seconds may overlap
        compute; parallel/diagnostics.py turns this into a table)."""
        return {name: dict(zip(("calls",) + _COUNTERS + ("seconds",), t))
                for name, t in self._totals.items()}

    def reset(self) -> None:
        self.__init__()
