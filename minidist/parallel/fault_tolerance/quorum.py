"""Who is in the quorum: the replicas, which of them are live, and their group.

A *replica* is one coordinate along the replicate dimension of the mesh: the ranks
that hold one whole copy of the model (one rank under DDP; a DDP or FSDP pair
of ranks when each replica is itself split). Replica i is *live* while none of
its ranks has died (``transport.failed_ranks()``: the launcher marks a rank
that died in a world that goes on, World(fault_tolerant=True)). The quorum is
the first ``num_replicas`` live replicas in index order,

    quorum = [i for i in range(R) if replica i is live][:num_replicas]

so that replicas past ``num_replicas`` are spares: the first live spare steps in
when a member dies, and nobody has to say so; every rank reads the same deaths.

Every rank talks to the ranks at its own place in the other replicas (its
*replicate group*, the column of the mesh through it along the replicate
dimension). The quorum's group over that column gets a transport context of its
own, a function of its members only:

    ctx = FT_CONTEXT + E * 2^N + sum_{r in members} 2^r   (+ VOTE_CONTEXT for the vote's)

with E the sum of the incarnations of the members' ranks (how many times a replacement
process took each over, comm/transport/replace.py; 0 without replacements) and N the
world's size: the same replicas back after a replacement are a new context.

A failed collective leaves messages behind in the old group's context (a survivor
that sent its piece of the ring before it saw the death); in the new context they
can never be matched, only set aside. Two ranks that read the deaths at
different moments and built different groups meet again once both have seen
them: the one in the larger group fails at once (a member is dead) and rebuilds.
"""
from __future__ import annotations

from typing import NamedTuple

from minidist.comm.errors import CommError
from minidist.comm.group import ProcessGroup, world_group
from minidist.distributed.device_mesh import _row_major

FT_CONTEXT = 1 << 30        # above every context new_group hands out (a counter from 1)
VOTE_CONTEXT = 1 << 29      # added for the group of every rank of the quorum (the vote)
MAX_WORLD = 29              # ranks a membership bit mask can name below 2^29


class ReplicaLostError(CommError):
    """A rank of this rank's own replica died: the replica leaves the quorum, and this
    rank stops training (a whole replica is restarted or healed, never half of it)."""


class QuorumLostError(CommError):
    """Fewer live replicas than ``min_replica_size``: per-step fault tolerance cannot go
    on, and the run falls back to a restart of the whole world (``minidist run
    --max-restarts``) from its last checkpoint."""


class Replicas(NamedTuple):
    """The replicas of a world along its replicate dimension."""
    ranks: list          # ranks[i]: the global ranks of replica i
    column: list         # column[i]: the rank of replica i at this rank's place
    mine: int            # the replica this rank belongs to


def replicas_of(mesh, dim: str | None) -> Replicas:
    """The replicas along ``dim`` of ``mesh`` (a DeviceMesh from init_device_mesh);
    ``mesh=None``: every rank of the world is a replica of its own."""
    me = world_group().rank
    if mesh is None and dim is not None:
        raise ValueError(f"replicate_dim={dim!r} names a dimension of a mesh, but no mesh was "
                         f"given: pass mesh=init_device_mesh(...), or neither (every rank a "
                         f"replica)")
    if mesh is None:
        size = world_group().size
        return Replicas([[r] for r in range(size)], list(range(size)), me)
    names = mesh.mesh_dim_names or ()
    if dim not in names:
        raise ValueError(f"the quorum dimension {dim!r} is not a dimension of the mesh "
                         f"{mesh}: its dimensions are {names}")
    axis, shape = names.index(dim), mesh.shape
    flat = _flatten(mesh.mesh)
    ranks: list = [[] for _ in range(shape[axis])]
    coord_of = {}
    for index, rank in enumerate(flat):
        coord = _unravel(index, shape)
        ranks[coord[axis]].append(rank)
        coord_of[rank] = coord
    mine_coord = coord_of[me]
    column = []
    for i in range(shape[axis]):
        place = list(mine_coord)
        place[axis] = i
        column.append(flat[_row_major(tuple(place), shape)])
    return Replicas(ranks, column, mine_coord[axis])


def live_replicas(replicas: Replicas, failed: list[int]) -> list[int]:
    """The replicas none of whose ranks has died, in index order."""
    dead = set(failed)
    return [i for i, ranks in enumerate(replicas.ranks) if not dead.intersection(ranks)]


def replica_lost(replicas: Replicas, failed: list[int]) -> ReplicaLostError:
    """The error for a rank of a replica whose other rank(s) died. A replica of several
    ranks is not replaced by ``minidist run --max-restarts``: the launcher starts a new
    process for a dead rank, as the same rank, and its partners have left the run."""
    mine = replicas.ranks[replicas.mine]
    dead = sorted(set(failed) & set(mine))
    message = f"replica {replicas.mine} lost rank(s) {dead}: it leaves the quorum"
    if len(mine) > 1:
        message += (f"; a replica of {len(mine)} ranks is not replaced by minidist run "
                    f"--max-restarts (only a replica of one rank is): give spare replicas "
                    f"at start (Manager(num_replicas=...) below the replicas of the mesh)")
    return ReplicaLostError(message)


def quorum_members(live: list[int], num_replicas: int) -> list[int]:
    """The first ``num_replicas`` live replicas: the members; the rest wait as spares."""
    return live[:num_replicas]


def quorum_groups(replicas: Replicas, members: list[int],
                  timeout: float) -> tuple[ProcessGroup, ProcessGroup]:
    """(the column's group, the group of every rank of the members): gradients are
    averaged along the column, the vote and the steps are taken over all, so that a
    step commits on every rank of the quorum or on none."""
    every = sorted(r for i in members for r in replicas.ranks[i])
    column = _group(sorted(replicas.column[i] for i in members), 0, every, timeout)
    return column, _group(every, VOTE_CONTEXT, every, timeout)


def _group(ranks: list[int], offset: int, watched: list[int], timeout: float) -> ProcessGroup:
    """A group of ``ranks`` in a context of its membership. The death of any of
    ``watched`` (every rank of the members) ends its waits, not only of its own ranks:
    the dead rank's partner in its replica stops too. No same-call check: a member
    that failed its step goes on to the vote while the others may still be in the
    all-reduce, and its vote's messages must be set aside, not taken for a mismatch."""
    world = world_group()
    epoch = sum(world.transport.incarnation(r) for r in watched)
    if (epoch + 1) << world.size > VOTE_CONTEXT:
        raise ValueError(f"{epoch} replacements are more than a quorum's context can "
                         f"count in a world of {world.size} ranks")
    ctx = FT_CONTEXT + offset + (epoch << world.size) + sum(1 << r for r in ranks)
    world.transport.watch_deaths(ctx, watched)
    return ProcessGroup(world.transport, ranks, ctx, timeout, check=False)


def _flatten(nested) -> list[int]:
    if isinstance(nested, int):
        return [nested]
    return [r for item in nested for r in _flatten(item)]


def _unravel(index: int, shape: tuple) -> list[int]:
    coord = []
    for n in reversed(shape):
        index, c = divmod(index, n)
        coord.append(c)
    return list(reversed(coord))

