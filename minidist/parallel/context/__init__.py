"""Context parallelism: the sequence split over N ranks, attention computed across them.

Ring attention: each rank keeps its queries; key/value blocks travel round the ring and
each rank folds the block it holds into its output with the online-softmax rule,

    m' = max(m, rowmax S);  l' = e^(m - m') l + sum e^(S - m');  O' = e^(m - m') O + e^(S - m') V

With a causal mask the zigzag split (chunks i and 2N-1-i on rank i) gives every rank
the same work.

Files:

- ring_attention.py  ``ring_attention`` / ``RingAttention``, ``shard_sequence`` (zigzag),
                     ``plan_work``

Docs: docs/attention.md. Demo: demos/11_ring_attention.py. Tests: tests/parallel/context/.
"""
from minidist.parallel.context.ring_attention import (RingAttention, plan_work, ring_attention,
                                                      shard_sequence, unshard_sequence)

__all__ = ["ring_attention", "RingAttention", "shard_sequence", "unshard_sequence",
           "plan_work"]
