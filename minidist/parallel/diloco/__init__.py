"""DiLoCo and Streaming DiLoCo: replicas that talk every H steps, not every step.

Each replica (a rank, or a group of ranks that is itself DDP / TP) takes H =
``sync_every`` steps with its own inner optimizer, then the replicas average the
outer gradient theta_global - theta_local and an outer optimizer (SGD with Nesterov
momentum) takes one step from theta_global with it:

    Delta = (1/N) sum_i (theta_global - theta_i);   theta_global <- OuterOpt(theta_global, Delta)

Streaming DiLoCo synchronises F fragments in turn, each overlapped with tau inner
steps and merged as alpha * local + (1 - alpha) * global, its outer gradient
optionally rounded to a low precision format.

Files, in reading order:

- schedule.py    which fragment starts after which inner step, when it is merged; the
                 checks on H, F, tau, alpha
- outer_grad.py  the outer gradient rounded to bf16 / fp8 / fp4 under a power-of-two scale
- fragments.py   which parameters each fragment synchronises (frozen ones left out),
                 the check on the outer optimizer
- shard.py       ``shard_group``: each rank of a DDP replica sends its slice of the outer
                 gradient across the replicas, the replica all-gathers the slices
- diloco.py      ``DiLoCo``: the step post-hook on the inner optimizer (torchft's API)
- over_quorum.py ``DiLoCo(..., manager=...)``: a fault-tolerance quorum per outer step; a
                 replica lost between syncs costs only its outer gradient

Docs: docs/diloco.md. Demo: demos/25_diloco.py. Tests: tests/parallel/diloco/.
Bench: bench/bench_diloco.py. Cost: ``minidist calc diloco``.
"""
from minidist.parallel.diloco.diloco import DiLoCo, Fragment
from minidist.parallel.diloco.outer_grad import outer_grad_format, round_outer_gradient
from minidist.parallel.diloco.schedule import check_schedule, fragment_starting_at

__all__ = ["DiLoCo", "Fragment", "outer_grad_format", "round_outer_gradient",
           "check_schedule", "fragment_starting_at"]
