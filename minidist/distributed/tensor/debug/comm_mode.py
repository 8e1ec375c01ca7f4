"""CommDebugMode: count the collectives that placements cause inside a region (torch's).

    with CommDebugMode() as comm_mode:
        loss = model(x).sum()
        loss.backward()
    comm_mode.get_comm_counts()     # {'all_reduce': 2}
    comm_mode.get_total_counts()    # 2
    comm_mode.get_phase_counts()    # {'forward': {'all_reduce': 1}, 'backward': {'all_reduce': 1}}

It counts what DTensor's redistribute (and so parallelize_module's styles)
issues, by collective and by phase (forward, or backward: inside a DTensor
op's backward), with the bytes this rank put into each (the input size of the
collective; what the wire carries is the collective's own formula, see
docs/placements.md). Collectives called directly on minidist.distributed are not
counted: ``get_stats()`` has those.
"""
from __future__ import annotations

from collections import defaultdict

from minidist.distributed.tensor import _collectives


class CommDebugMode:
    """Counts collectives inside ``with`` (module docstring)."""

    def __init__(self):
        self.comm_counts: dict[str, int] = defaultdict(int)
        self.phase_counts: dict[str, dict[str, int]] = {"forward": defaultdict(int),
                                                        "backward": defaultdict(int)}
        self.comm_bytes: dict[str, int] = defaultdict(int)

    def record(self, name: str, phase: str, group_size: int, nbytes: int) -> None:
        self.comm_counts[name] += 1
        self.phase_counts[phase][name] += 1
        self.comm_bytes[name] += nbytes

    def get_comm_counts(self) -> dict[str, int]:
        return dict(self.comm_counts)

    def get_total_counts(self) -> int:
        return sum(self.comm_counts.values())

    def get_phase_counts(self) -> dict[str, dict[str, int]]:
        return {phase: dict(counts) for phase, counts in self.phase_counts.items()}

    def __enter__(self) -> "CommDebugMode":
        _collectives.OBSERVED.modes.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _collectives.OBSERVED.modes.remove(self)

    def table(self) -> str:
        """The counts as text, a line per collective."""
        lines = [f"{'collective':<24}{'forward':>8}{'backward':>9}{'bytes in':>12}"]
        for name in sorted(self.comm_counts):
            lines.append(f"{name:<24}{self.phase_counts['forward'].get(name, 0):>8}"
                         f"{self.phase_counts['backward'].get(name, 0):>9}"
                         f"{self.comm_bytes[name]:>12}")
        return "\n".join(lines)
