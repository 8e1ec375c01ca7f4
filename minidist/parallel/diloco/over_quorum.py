"""DiLoCo over a fault-tolerance Manager: a quorum per outer step (torchft's DiLoCo).

With ``DiLoCo(..., manager=manager)`` the replicas are the manager's (parallel/
fault_tolerance/: a rank each, or the ranks of one coordinate of the mesh's replicate
dimension), and every synchronisation of a fragment is one step of the manager:

    loop:
        manager.start_quorum()                 # who is in (read again after a failure)
        Delta = theta_global - theta_local     # this replica's outer gradient
        manager.allreduce(Delta)               # (1/Q) sum over the Q members of the quorum
        if manager.should_commit(): break      # every member finished it
    theta_global <- OuterOpt(theta_global, Delta);  theta_local <- theta_global

A replica that dies between two synchronisations, or inside the outer all-reduce, makes
that all-reduce fail on every survivor (``PeerDiedError``, at once), so the attempt does
not commit anywhere: no outer step, theta_global unchanged. The survivors then form the
quorum of the live replicas and all-reduce the *same* outer gradients again, divided by
the new Q. The lost replica costs only its own outer gradient (its H inner steps) and
one failed all-reduce; the survivors keep their inner steps. (torchft's DiLoCo drops the
round instead: every survivor goes back to theta_global and redoes its H steps.)

The state a healing replica receives is the caller's (model, inner optimizer, sampler)
and DiLoCo's own, registered with the manager under "diloco" (``DiLoCo.state_dict``):
theta_global of each fragment, the outer optimizer's state (its momentum) and the inner
step count. The manager's first quorum makes every replica alike (init_sync), as the
broadcast from the group's first rank does without a manager.

A replica healed at a sync (a replacement process, or a member that missed a commit)
holds its source's model: none of the round's inner steps are its own, and its outer
gradient would count the source's a second time. It sends zeros, and a 0 where the
others send a 1 after their outer gradients, so the mean is over the P replicas that
took the round's steps:

    mean = (sum_{p in P} Delta_p / Q) / (P / Q)          (P = Q: divided by exactly 1)

It then takes the same outer step (it holds the source's theta_global and momentum) and
starts the next round from theta_global in every fragment, as the others do.

Not here yet: spares (a spare would heal as a replacement does, untested),
``fragment_sync_delay`` > 0 (the all-reduce in flight across inner steps),
``outer_grad_format`` and ``shard_group``. Docs: docs/fault_tolerance.md.
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp
from minidist.parallel.diloco.schedule import fragment_starting_at


def check_manager(manager: Any, group: Any, shard_group: Any, outer_grad_format: Any,
                  fragment_sync_delay: int) -> None:
    """Refuse what DiLoCo over a manager does not do, naming it."""
    if group is not None or shard_group is not None:
        raise ValueError("with a manager the replicas are the manager's (its mesh and "
                         "replicate_dim): pass group=None and shard_group=None")
    if outer_grad_format is not None or fragment_sync_delay != 0:
        raise ValueError("DiLoCo over a manager synchronises in full precision with "
                         "fragment_sync_delay=0 (outer_grad_format and a delay are not "
                         "supported with a manager)")
    if manager.num_replicas != len(manager.replicas.ranks):
        raise ValueError(f"DiLoCo over a manager takes no spares: num_replicas="
                         f"{manager.num_replicas} of {len(manager.replicas.ranks)} replicas "
                         "(spares are not supported yet; a replacement process "
                         "heals in place of a lost replica)")


def sync_over_quorum(diloco: Any, f: int) -> None:
    """Fragment f's outer step over the quorum, tried again over the live replicas until
    an attempt commits (module docstring)."""
    manager = diloco.manager
    while True:
        manager.start_quorum()       # heals this replica if it is behind (a lost vote)
        # after a heal the inner step (and so the fragment) is its source's
        healed = fragment_starting_at(diloco.local_step, diloco.sync_every,
                                      len(diloco.fragments))
        f = f if healed is None else healed
        frag = diloco.fragments[f]
        deltas = [(g - p.data).reshape(-1) for g, p in zip(frag.global_params, frag.params)]
        if diloco.healed:            # its model is its source's: no steps of its own
            deltas = [xp.zeros_like(d) for d in deltas]
        took_steps = xp.full(1, 0.0 if diloco.healed else 1.0, dtype=deltas[0].dtype)
        wire = xp.concatenate(deltas + [took_steps])                         # (sum numel + 1,)
        manager.allreduce(wire)      # sum / Q, in place; on a failure the step won't commit
        if manager.should_commit():
            break
    mean = wire[:-1] / wire[-1]      # (sum over the P that took steps / Q) / (P / Q); P = Q: / 1
    frag.wire = wire
    frag.history.append((diloco.local_step, diloco.local_step))
    diloco.outer_step(frag, mean)
    if diloco.healed:                # start the next round from theta_global, as the others
        for other in diloco.fragments:
            for g, p in zip(other.global_params, other.params):
                p.data[...] = g
        diloco.healed = False

