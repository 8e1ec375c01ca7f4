"""What a rank moved: bytes and messages, in total, per collective, and in the last one.

Every collective adds what it sent and received (``group.stats``; ``dist.get_stats()``),
so a test can check the ring's 2(N-1)/N * M per rank and a bench can print
the bytes beside the time. Two ways to count:

- as it goes: point-to-point calls and most collectives add their bytes to
  ``counted`` (a ``Counts``) while they move them; their runner takes a
  snapshot before and records the difference after (``record``);
- per plan: a call of the latency path (oneshot.py, alltoall_board.py) moves
  what its plan says, the same every call. Its plan holds a ``Tally`` and a
  call counts itself in it: one more call, its seconds (``count``). The
  totals multiply out on read:

    bytes_sent = counted.bytes_sent + sum over listed tallies t of t.calls * t.delta[0]

  A tally is listed at its first call (and again at its first after a
  ``reset``); past MAX_TALLIES listed, every listed tally is folded into
  ``counted`` and the per-collective totals, emptied and unlisted, so plans
  that come and go (all-to-all splits that change every call) keep the list short.

``add`` is the plain version of ``count`` (every counter written on every
call), kept as its oracle: the same calls counted either way read the same.
"""
from __future__ import annotations

_COUNTERS = ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv")
MAX_TALLIES = 64   # tallies listed before they are folded into the counted totals


class Counts:
    """The four counters of what was counted as it moved (plain attributes: a
    point-to-point call adds to them on every message)."""
    __slots__ = _COUNTERS

    def __init__(self):
        self.bytes_sent = self.bytes_recv = self.msgs_sent = self.msgs_recv = 0


class Tally:
    """Every call of one plan of the latency path: what one call moves (fixed)
    and how many calls ran, in how many seconds."""
    __slots__ = ("name", "info", "delta", "calls", "seconds")

    def __init__(self, name: str, info: dict, delta: tuple):
        self.name = name        # the collective, "all_reduce"
        self.info = info        # its call fields, as ``last`` shows them
        self.delta = delta      # (bytes_sent, bytes_recv, msgs_sent, msgs_recv) of one call
        self.calls = 0
        self.seconds = 0.0


class CommStats:
    """Bytes and messages this rank moved: in total, per collective, and in the
    last collective (``last``: a dict with the collective's name, its call
    fields, and the four counters)."""

    def __init__(self):
        self.counted = Counts()           # counted as it moved
        self.inter_node_bytes = 0         # sent between nodes by the hierarchical all-reduce
        self._tallies: list[Tally] = []   # the tallies with calls not yet folded in
        self._last: tuple | Tally = ("", {}, (0, 0, 0, 0))   # (name, info, delta), or a Tally
        self._totals: dict = {}           # name -> [calls, *counters, seconds] (counted)

    # -- the totals, counted and tallied -----------------------------------------
    def _total(self, i: int) -> int:
        return getattr(self.counted, _COUNTERS[i]) + sum(t.calls * t.delta[i]
                                                         for t in self._tallies)

    @property
    def bytes_sent(self) -> int:
        return self._total(0)

    @property
    def bytes_recv(self) -> int:
        return self._total(1)

    @property
    def msgs_sent(self) -> int:
        return self._total(2)

    @property
    def msgs_recv(self) -> int:
        return self._total(3)

    # -- counting as it goes -----------------------------------------------------
    def snapshot(self) -> tuple[int, int, int, int]:
        """The counted counters now (a call's tallied ones do not move during it)."""
        c = self.counted
        return (c.bytes_sent, c.bytes_recv, c.msgs_sent, c.msgs_recv)

    def record(self, name: str, before: tuple, info: dict, seconds: float = 0.0) -> None:
        """Note what the collective ``name`` moved since ``before`` (a snapshot), and
        how long it ran. Kept as plain numbers: this runs on every call, dicts are
        built on demand."""
        c = self.counted
        delta = (c.bytes_sent - before[0], c.bytes_recv - before[1],
                 c.msgs_sent - before[2], c.msgs_recv - before[3])
        self._note(name, info, delta, seconds)

    def add(self, name: str, info: dict, delta: tuple, seconds: float = 0.0) -> None:
        """``record`` for a call that knows what it moves beforehand: ``delta`` =
        (bytes_sent, bytes_recv, msgs_sent, msgs_recv). The plain version of
        ``count``, and its oracle."""
        c = self.counted
        c.bytes_sent += delta[0]
        c.bytes_recv += delta[1]
        c.msgs_sent += delta[2]
        c.msgs_recv += delta[3]
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

    # -- counting per plan -------------------------------------------------------
    def count(self, tally: Tally, seconds: float) -> None:
        """One call of ``tally``'s plan, which ran ``seconds``: what ``add`` notes, in
        three stores (the counters multiply out on read)."""
        if not tally.calls:          # its first call since it was made, reset or folded
            self._list(tally)
        tally.calls += 1
        tally.seconds += seconds
        self._last = tally

    def _list(self, tally: Tally) -> None:
        if len(self._tallies) >= MAX_TALLIES:
            self._fold()
        self._tallies.append(tally)

    def _fold(self) -> None:
        """Every listed tally into ``counted`` and the totals; emptied, unlisted."""
        for t in self._tallies:
            moved = [t.calls * d for d in t.delta]
            c = self.counted
            c.bytes_sent += moved[0]
            c.bytes_recv += moved[1]
            c.msgs_sent += moved[2]
            c.msgs_recv += moved[3]
            _add_row(self._totals, t.name, t.calls, moved, t.seconds)
            t.calls, t.seconds = 0, 0.0
        self._tallies = []

    # -- reading -----------------------------------------------------------------
    @property
    def last(self) -> dict:
        last = self._last
        if isinstance(last, Tally):
            name, info, delta = last.name, last.info, last.delta
        else:
            name, info, delta = last
        if not name:
            return {}
        return dict(collective=name, **info, **dict(zip(_COUNTERS, delta)))

    @property
    def per_collective(self) -> dict:
        """name -> calls, the four counters, and ``seconds``: how long its calls ran
        in all (an async call runs in the background, so its seconds may overlap
        compute; parallel/diagnostics.py turns this into a table)."""
        totals = {name: list(t) for name, t in self._totals.items()}
        for t in self._tallies:
            _add_row(totals, t.name, t.calls, [t.calls * d for d in t.delta], t.seconds)
        return {name: dict(zip(("calls",) + _COUNTERS + ("seconds",), t))
                for name, t in totals.items()}

    def reset(self) -> None:
        """Every count back to 0 (the plans keep their tallies, emptied and unlisted)."""
        for t in self._tallies:
            t.calls, t.seconds = 0, 0.0
        self.__init__()


def _add_row(totals: dict, name: str, calls: int, moved, seconds: float) -> None:
    """``calls`` calls of ``name`` that moved ``moved`` in ``seconds``, into its row."""
    row = totals.get(name)
    if row is None:
        row = totals[name] = [0, 0, 0, 0, 0, 0.0]
    row[0] += calls
    for i in range(4):
        row[1 + i] += moved[i]
    row[5] += seconds
