"""Per-step fault tolerance: a failure costs one step, not a restart (torchft's model).

Before each step the live replicas agree on a quorum; the gradient all-reduce runs over
its members only and is divided by their number; a step commits only if every member
finished it; a member that dies mid-step fails the step on the survivors (at once, never
a hang), who go on in a smaller quorum; a spare or a replica that is behind heals by
receiving the state from a live peer, over the collectives, with no checkpoint:

    quorum = first num_replicas live replicas;  g = (1/Q) sum_{q in quorum} g_q
    commit = MIN over the quorum of "my all-reduce finished"

Files, in reading order:

- quorum.py     the replicas along the mesh's replicate dimension, which are live, the
                quorum's group in a context of its membership
- pack.py       the state (skeleton + arrays) as one byte buffer
- heal.py       that buffer sent from a live peer to a healing one, in one message
- manager.py    ``Manager``: start_quorum, allreduce, should_commit, current_step
- change.py     ``QuorumChange``: the line printed for each change of the quorum
- seen.py       the trace's events: "step 7 failed", "quorum 3 of 4", "heal from replica 0
                (N bytes)"
- wrappers.py   ``DistributedDataParallel`` over the quorum, ``OptimizerWrapper``

The world must go on when a rank dies: ``World(fault_tolerant=True)`` (comm/launch),
whose waits then fail with ``PeerDiedError`` naming the dead rank (comm/transport);
``minidist run --fault-tolerant --max-restarts K`` starts a replacement process for a
dead rank, which joins the next quorum and heals (comm/transport/replace.py).
Docs: docs/fault_tolerance.md. Tests: tests/parallel/fault_tolerance/.
"""
from minidist.parallel.fault_tolerance.change import QuorumChange
from minidist.parallel.fault_tolerance.manager import Manager
from minidist.parallel.fault_tolerance.quorum import QuorumLostError, ReplicaLostError
from minidist.parallel.fault_tolerance.wrappers import DistributedDataParallel, OptimizerWrapper

__all__ = ["Manager", "QuorumChange", "QuorumLostError", "ReplicaLostError",
           "DistributedDataParallel", "OptimizerWrapper"]
