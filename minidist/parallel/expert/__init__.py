"""Expert parallelism: the experts of each mixture-of-experts layer spread over ranks.

A token visits k of the E experts; with ep ranks each holding E/ep experts, the
tokens travel to their experts and back with two all-to-alls per layer (and two in
backward), whose split sizes follow the router's choices:

    dispatch + combine, forward, per rank:  2 * k * S * C * itemsize * (ep-1)/ep bytes
    dense gradients averaged over dp * ep ranks, expert gradients over the dp copies

Files, in reading order:

- dispatch.py         all-to-all with uneven splits as an autograd op (backward: the
                      split matrix transposed), started in the background and waited
                      for (overlap; in DualPipeV's F&B, the other micro-batch's turn
                      meanwhile), and the exchange of counts before it
- expert_parallel.py  ``ExpertMesh`` (dp x ep), ``ExpertParallelMoE``,
                      ``expert_parallel(model, mesh)``, ``sync_expert_parallel_gradients``

The one-process oracle is minidist/nn/moe.py. Docs: docs/moe.md. Demo: demos/15_moe.py.
Tests: tests/parallel/expert/.
"""
from minidist.parallel.expert.dispatch import all_to_all, exchange_counts
from minidist.parallel.expert.expert_parallel import (ExpertMesh, ExpertParallelMoE,
                                                      expert_parallel,
                                                      sync_expert_parallel_gradients)

__all__ = ["ExpertMesh", "ExpertParallelMoE", "expert_parallel",
           "sync_expert_parallel_gradients", "all_to_all", "exchange_counts"]
