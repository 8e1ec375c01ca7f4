"""A fault-tolerant world's new processes for dead ranks: each of the first K ranks that
die is started again, as the same rank, once every other running rank has let go of it.

The order matters. A survivor may still hold the dead rank's channels (a message half
read, a slot it waits on); the launcher counts the deaths each running rank has seen
(``shm.seen_deaths``) and starts the new process only when every one of them has seen
this death, so the newcomer's transport takes the channels and board slot over where
they stand (comm/transport/replace.py). It runs the function of the run in progress from
its start; fault tolerance heals it from a live peer (parallel/fault_tolerance/). With
no rank left running there is nobody to heal it from, and the rank is given up.
"""
from __future__ import annotations

from typing import Any

from minidist.comm.transport import shm


class Respawner:
    """The dead ranks a world may still start again, and those it did."""

    def __init__(self, allowed: int):
        self.left = allowed                   # new processes the world may still start
        self.done: list = []                  # the deaths (RankLost) a new process took over
        self.waiting: dict[int, tuple] = {}   # rank -> (RankLost, deaths to be seen first)
        self.gone: list = []                  # the processes that died and were replaced

    def wait_for(self, lost: Any, deaths: int) -> bool:
        """Take dead rank ``lost.rank`` to start again once ``deaths`` are seen by all;
        False when none is left to start."""
        if self.left <= len(self.waiting):
            return False
        self.waiting[lost.rank] = (lost, deaths)
        return True

    def start_due(self, world: Any, pending: set, results: list) -> None:
        """Start each waiting rank whose death every other running rank has seen; give
        it up (a RankLost in ``results``) when none is running."""
        for r, (lost, deaths) in list(self.waiting.items()):
            others = [q for q in pending if q not in self.waiting]
            if not others:
                results[r] = world.lost[r] = lost
                pending.discard(r)
            elif all(shm.seen_deaths(world._segment, q) >= deaths for q in others):
                self._start(world, r, lost)
            else:
                continue
            del self.waiting[r]

    def _start(self, world: Any, r: int, lost: Any) -> None:
        """A new process as dead rank r, running the run in progress."""
        shm.revive(world._segment, r)
        incarnation = len([x for x in self.done if x.rank == r]) + 1
        env = dict(world._options["env"], MINIDIST_REPLACEMENT=str(incarnation))
        options = dict(world._options, env=env, announce=False)
        world._respawn(r, options)
        self.done.append(lost)
        self.left -= 1
