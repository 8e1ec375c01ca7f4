"""A dead rank taken over by a replacement process, in a world that goes on
(``World(fault_tolerant=True, replacements=K)``; fault tolerance heals it from a peer).

The replacement is the same rank in the same segment: its channels, its board slot and
its rank record are the dead process's. What the dead process left half done must not
reach the new one, nor what the others still held for the dead one:

1. The launcher marks the rank dead (``shm.mark_died``: the mark, then the world's death
   count W_DEATHS += 1).
2. Every live rank, at its next look at the deaths (``drop_dead_peers``, from the fault
   tolerance's quorum), drops its sends to it, its receives from it and the pieces it
   left in the channel to this rank (``tail := head``), forgives the board posts it was
   to read, then writes the death count it read into its record (R_SEEN).
3. Once every live rank has done so, the launcher counts a new incarnation
   (``shm.revive``) and starts the replacement.
4. The replacement's transport takes the channels over where they stand (``count :=
   head`` on both sides: nothing old is read, nothing new overwrites what a peer has not
   read), its board slot with nothing posted, and only then clears the dead mark: from
   then on it is live to the others.

Quorum groups name their transport context after their members and the sum of the
members' incarnations (parallel/fault_tolerance/quorum.py), so a quorum of the same
replicas formed again after a replacement never matches a message of the old one.
"""
from __future__ import annotations

import os

from minidist.comm.errors import NotThisRankError
from minidist.comm.transport import shm


class Replacements:
    """Mixed into LocalTransport (local.py): which process may be rank r."""

    def _refuse_a_stranger(self, segment_name: str, rank: int) -> None:
        """Only the process the launcher started as ``rank`` may join as it."""
        holder = self._ranks[rank * shm.RANK_WORDS + shm.R_PID]
        if holder and holder != os.getpid():
            self._ranks.release()
            shm.untrack(self._seg)   # else its exit would take the segment from the world
            shm.close(self._seg)
            raise NotThisRankError(
                f"process {os.getpid()} cannot join the world in {segment_name} as rank "
                f"{rank}: rank {rank} is process {holder}. A process a rank starts inherits "
                f"MINIDIST_SHM and RANK; unset them in it (or start a world of its own)")

    def drop_dead_peers(self) -> list[int]:
        seen = shm.deaths(self._seg)        # first: every death it counts is marked
        failed = self.failed_ranks()
        for r in failed:
            if r not in self._dropped:
                self._drop_peer(r)
        self._dropped = set(failed)         # a rank taken over is live again
        self._ranks[self.rank * shm.RANK_WORDS + shm.R_SEEN] = seen
        return failed

    def _drop_peer(self, r: int) -> None:
        """Forget everything to and from dead rank r (step 2 of the module docstring)."""
        with self._lock:
            for held in (self._sends, self._posted, self._current, self._unexpected):
                held.pop(r, None)
            ch = self._in[r]
            ch.count = self._words[ch.head_i]        # what it sent and we never took
            self._words[ch.tail_i] = ch.count
            if self.board is not None:               # its acks of our posts stop here
                self.board.owed[r] = self.board._words[self.board.acks[r] + self.rank]

    def _take_over(self) -> None:
        """Step 4: this process replaces a dead rank; take its channels as they stand."""
        w = self._words
        for ch in self._in:
            ch.count = w[ch.head_i]
            w[ch.tail_i] = ch.count
        for ch in self._out:
            ch.count = w[ch.head_i]
        if self.board is not None:
            board = self.board
            board._words[board.head[self.rank]] = 0          # no post of ours is there
            board.owed = [board._words[board.acks[q] + self.rank]
                          for q in range(self.world_size)]
        self._ranks[self.rank * shm.RANK_WORDS + shm.R_DIED] = 0
        self._bells.ring_all()

    def incarnation(self, rank: int) -> int:
        return self._ranks[rank * shm.RANK_WORDS + shm.R_INCARNATION]

    def exit_code(self, rank: int) -> int | None:
        died = self._ranks[rank * shm.RANK_WORDS + shm.R_DIED]
        return died - shm.DIED_BASE if died else None
