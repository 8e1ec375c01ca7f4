"""Manager: a quorum per step, an all-reduce over its members, and a step that commits
only when every member finished it (torchft's ``Manager``, on minidist's collectives).

    manager = Manager(load_state_dict, state_dict, min_replica_size=2)
    for batch in batches:
        manager.start_quorum()               # who is in at this step; heal if behind
        loss = model(batch); loss.backward()
        for p in model.parameters():
            manager.allreduce(p.grad)        # sum over the quorum / its size
        if manager.should_commit():          # every member finished: step
            optimizer.step()

The rules, per step:

- **Quorum.** ``start_quorum`` reads which replicas are live (quorum.py), at the
  first step, after a step that failed, and after a vote in which some member saw a
  replica come (a replacement process) or go; never otherwise: a death fails the step
  on every rank of the quorum (the vote is over all of them), so they all read it at
  the same step;
  a rank that read it earlier than a partner in its replica would wait for the new
  quorum while the partner waits for it in their own group. When the members
  changed, it forms their group in a context of its own, then agrees on the step: every member gives its step, s* = max. A member behind s* (a spare
  stepping in, a replica that missed a commit) *heals*: it receives the state from
  the first member at s* (heal.py) and is at s* from then on.
- **All-reduce over the quorum.** ``allreduce(g)`` sums g over the members and
  divides by their number Q, not the world's: the mean gradient of the batches
  that are actually there,  g = (1/Q) sum_{q in quorum} g_q.
- **Commit.** ``should_commit`` is one more all-reduce, of a flag (MIN over the
  members): 1 only if every member's all-reduce finished. A member that died
  mid-step (forward, backward, inside the all-reduce) makes every survivor's
  all-reduce fail at once (``PeerDiedError``: the transport sees the death,
  local_wait.py), or after the group's timeout at worst, never a hang; the vote
  fails too, so nobody steps and the step's gradients are dropped. The survivors
  form a smaller quorum at the next ``start_quorum`` and go on.

A death inside the vote itself can leave some members committed and others not;
they differ in step, so the next quorum heals the ones behind from one that is ahead.
Fewer live replicas than ``min_replica_size`` raises ``QuorumLostError``: the run falls
back to a restart of the whole world from its checkpoint (``minidist run
--max-restarts``). Docs: docs/fault_tolerance.md. Tests: tests/parallel/fault_tolerance/.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives.api import all_reduce
from minidist.comm.errors import CommTimeoutError, PeerDiedError, PeerFinishedError
from minidist.comm.group import world_group
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.parallel.fault_tolerance import heal, seen
from minidist.parallel.fault_tolerance.change import QuorumChange
from minidist.parallel.fault_tolerance.quorum import (MAX_WORLD, QuorumLostError,
                                                      live_replicas, quorum_groups,
                                                      quorum_members, replica_lost, replicas_of)

FAILURES = (PeerDiedError, CommTimeoutError)   # what fails a step instead of the run
SPARE_WAIT_S = 0.05    # the longest a spare sleeps between looks (a death or a return wakes it)


class Manager:
    """Per-step fault tolerance over the replicas of ``mesh`` along ``replicate_dim``
    (``mesh=None``: every rank is a replica). ``state_dict()`` / ``load_state_dict(s)``:
    the whole training state a healing replica receives (model, optimizer, RNG,
    sampler); ``min_replica_size``: fewer live replicas end the run (a world restart);
    ``num_replicas``: how many take part, the rest being spares that step in when a
    member dies (None: all); ``init_sync``: at the first quorum every member takes the
    first member's state, so that all start alike; ``timeout``: the longest a
    collective of the quorum may wait (None: the world's); ``log``: print each change
    of the quorum, one line (``QuorumChange``), from one rank."""

    def __init__(self, load_state_dict: Callable[[Any], None], state_dict: Callable[[], Any],
                 min_replica_size: int = 1, *, mesh: Any = None,
                 replicate_dim: str | None = None, num_replicas: int | None = None,
                 init_sync: bool = True, timeout: float | None = None, log: bool = False):
        world = world_group()
        if world.size > MAX_WORLD:
            raise ValueError(f"fault tolerance names ranks in a bit mask: at most {MAX_WORLD} "
                             f"ranks, the world has {world.size}")
        self.replicas = replicas_of(mesh, replicate_dim)
        total = len(self.replicas.ranks)
        self.num_replicas = total if num_replicas is None else num_replicas
        if not 1 <= min_replica_size <= total:
            raise ValueError(f"min_replica_size={min_replica_size} must be between 1 and the "
                             f"{total} replicas of the world")
        if not min_replica_size <= self.num_replicas <= total:
            raise ValueError(f"num_replicas={self.num_replicas} must be between "
                             f"min_replica_size={min_replica_size} and the {total} replicas")
        self.min_replica_size = min_replica_size
        # the parts of the healed state: "user" is the caller's, the others registered
        self._parts: dict[str, tuple] = {"user": (load_state_dict, state_dict)}
        self._transport = world.transport
        self.timeout = world.timeout if timeout is None else timeout
        self.log = log
        self._synced = not init_sync   # has a first quorum made every member alike?
        self._step = 0
        self._members: list[int] | None = None
        self._group = self._everyone = None    # the column's group, every rank's group
        self._errored: Exception | None = None
        self._read_again = False       # read the deaths again at the next start_quorum
        self.changes: list[QuorumChange] = []   # every quorum this rank formed

    # -- what torchft's Manager answers ---------------------------------------
    def current_step(self) -> int:
        """Steps committed so far (the same on every member of the quorum)."""
        return self._step

    def num_participants(self) -> int:
        """Replicas in the current quorum: the divisor of ``allreduce``."""
        return len(self._members or ())

    def replica_id(self) -> int:
        return self.replicas.mine

    def errored(self) -> Exception | None:
        """The failure of this step, if any (it will not commit)."""
        return self._errored

    def report_error(self, error: Exception) -> None:
        """Fail this step (a failure seen outside ``allreduce``: a collective of the
        replica's own, in forward or backward)."""
        self._errored = error

    def register_state_dict_fn(self, key: str, load_state_dict: Callable[[Any], None],
                               state_dict: Callable[[], Any]) -> None:
        """Add a part to the state a healing replica receives, under ``key`` (a wrapper's
        own state: DiLoCo's theta_global and outer momentum, say)."""
        if key in self._parts:
            raise ValueError(f"a state part named {key!r} is already registered")
        self._parts[key] = (load_state_dict, state_dict)

    def _state(self) -> dict:
        return {key: save() for key, (_, save) in self._parts.items()}

    def _load_state(self, state: dict) -> None:
        for key, (load, _) in self._parts.items():
            load(state[key])

    # -- the step ---------------------------------------------------------------
    def start_quorum(self) -> bool:
        """Form this step's quorum (see the module docstring); heal if behind. False
        only for a spare that was never needed: the members have finished."""
        self._errored = None
        if self._members is not None and not self._read_again:
            return True                # nobody left or joined, or the vote would have said
        while True:
            members = self._membership()
            if members is None:
                return False
            if members == self._members:
                return True
            try:
                self._reconfigure(members)
                return True
            except FAILURES:
                continue   # a member died while the quorum formed: form it again
            except PeerFinishedError:
                return False   # a replacement too late: the others have finished the run

    def allreduce(self, tensor: Any) -> None:
        """``tensor`` <- (1/Q) sum over the quorum's Q members, in place. Once a death
        has failed this step (``PeerDiedError``) the call returns at once: the dead rank
        is one the quorum's groups watch, so the call would fail on every member anyway
        (each after spinning the transport's wait), and the next quorum, without it, is
        a context of its own. After a timeout (nobody seen dead) the call is still made,
        so that the members' calls in the group, the messages' tags, stay in step. A
        failed step does not commit."""
        if isinstance(self._errored, PeerDiedError):
            return
        try:
            all_reduce(tensor, group=self._group, algorithm="ring")
        except FAILURES as e:
            self._errored = self._errored or e
            self._transport.forget(self._group.ctx)
            return
        tensor /= len(self._members)

    def should_commit(self) -> bool:
        """True if every member of the quorum finished this step; then the step counts.
        On every member the same answer, unless a member dies inside this vote."""
        # (finished?, -(sees another membership?)): MIN is "every member finished" and
        # "some member sees a replica come or go", so that all read the deaths again
        vote = xp.asarray([0 if self._errored is not None else 1,
                           -int(self._sees_a_change())], dtype="int64")
        try:
            all_reduce(vote, op=ReduceOp.MIN, group=self._everyone, algorithm="ring")
            commit, change = (int(v) for v in backend.to_host(vote))
        except FAILURES as e:
            self._errored, commit, change = e, False, -1
            self._transport.forget(self._everyone.ctx)
        if commit:
            self._step += 1
        else:
            seen.step_failed(self._step, self._errored)      # the trace's instant
        self._read_again = not commit or change < 0
        return bool(commit)

    def _sees_a_change(self) -> bool:
        """Would the quorum read now differ (a replacement came back, a member died)?"""
        live = live_replicas(self.replicas, self._transport.failed_ranks())
        return quorum_members(live, self.num_replicas) != self._members

    # -- forming the quorum ---------------------------------------------------------
    def _membership(self) -> list[int] | None:
        """The members, once this replica is one; None if it is a spare whose members
        have all finished. Raises if this replica, or the quorum, is lost."""
        while True:
            mark = self._transport.news_mark()           # before the look: no news lost
            failed = self._transport.drop_dead_peers()   # a replacement may come later
            live = live_replicas(self.replicas, failed)
            if self.replicas.mine not in live:
                raise replica_lost(self.replicas, failed)
            if len(live) < self.min_replica_size:
                raise QuorumLostError(
                    f"only replicas {live} are live, fewer than min_replica_size="
                    f"{self.min_replica_size}: falling back to a restart of the whole world")
            members = quorum_members(live, self.num_replicas)
            if self.replicas.mine in members:
                return members
            column = [self.replicas.column[i] for i in members]
            if all(self._transport.has_returned(r) for r in column):
                return None
            self._transport.wait_news(mark, SPARE_WAIT_S)   # until a member dies or returns

    def _reconfigure(self, members: list[int]) -> None:
        """The members' groups, their steps, and the healing of those behind."""
        start, began = time.perf_counter(), time.monotonic()
        group, everyone = quorum_groups(self.replicas, members, self.timeout)
        try:
            top, source, healed, sent = self._agree(group, everyone, members)
        except FAILURES:
            self._transport.forget(group.ctx)        # what a dead member will never take
            self._transport.forget(everyone.ctx)
            raise
        codes = {r: self._transport.exit_code(r) for m in self._members or ()
                 for r in self.replicas.ranks[m]}
        left = tuple((m, tuple((r, codes[r]) for r in self.replicas.ranks[m]
                               if codes[r] is not None))
                     for m in self._members or () if m not in members)
        change = QuorumChange(top, tuple(members), len(self.replicas.ranks), left, healed,
                              source, sent, time.perf_counter() - start, began,
                              time.monotonic())
        self.changes.append(change)
        seen.quorum_changed(change, start)                   # the trace's span
        if self.log and world_group().rank == self.replicas.ranks[source][0]:
            print(change, flush=True)        # one line per change, from the source
        self._step, self._synced = top, True
        self._members, self._group, self._everyone = members, group, everyone

    def _agree(self, group, everyone, members: list[int]) -> tuple:
        """(the quorum's step, the source replica, the replicas healed from it, the bytes
        this rank sent them): the steps exchanged, then the state sent to those behind."""
        steps, synced = self._exchange_steps(everyone, members)
        top = max(steps)
        at_top = [m for m, s in zip(members, steps) if s == top]
        source = next((m for m in at_top if synced[members.index(m)]), at_top[0])
        healed = tuple(m for m, s, ok in zip(members, steps, synced)
                       if (s < top or not ok) and m != source)
        return top, source, healed, self._heal(group, source, healed)

    def _exchange_steps(self, everyone, members: list[int]) -> tuple[list[int], list[int]]:
        """Every member's step, and whether it was synced (took part in a quorum), over
        every rank of the quorum (MAX: a replica's ranks agree; a healing one is behind)."""
        me = members.index(self.replicas.mine)
        table = xp.full((2, len(members)), -1, dtype="int64")    # (steps, synced) x members
        table[0, me], table[1, me] = self._step, int(self._synced)
        all_reduce(table, op=ReduceOp.MAX, group=everyone, algorithm="ring")
        steps, synced = backend.to_host(table).tolist()
        return steps, synced

    def _heal(self, group, source: int, healed: tuple) -> int:
        """The source sends the state to each replica in ``healed``; they load it."""
        column, mine = self.replicas.column, self.replicas.mine
        start, sent = seen.now(), 0
        if mine == source and healed:
            state = self._state()
            sent = heal.send_state(state, [column[m] for m in healed], group)
            seen.healing(source, healed, sent // len(healed), True, start)
        elif mine in healed:
            received = heal.recv_state(column[source], group)
            self._load_state(received.state)
            seen.healing(source, healed, received.nbytes, False, start)
        return sent
