"""Context parallelism: the sequence split over N ranks, attention computed across them.

Ring attention: each rank keeps its queries; key/value blocks travel round the ring and
each rank folds the block it holds into its output with the online-softmax rule,

    m' = max(m, rowmax S);  l' = e^(m - m') l + sum e^(S - m');  O' = e^(m - m') O + e^(S - m') V

With a causal mask the zigzag split (chunks i and 2N-1-i on rank i) gives every rank
the same work; sliding windows and packed documents mask each block by the global
positions of its queries and keys.

Ulysses (DeepSpeed-Ulysses): one all-to-all turns sequence shards into head shards
over the full sequence, attention runs on H/N heads, one all-to-all turns it back;
4 (N-1)/N * M bytes per rank instead of the ring's 2 (N-1) M, but N must divide H.

Files:

- ring_attention.py  ``ring_attention`` / ``RingAttention``, ``shard_sequence`` (zigzag),
                     ``plan_work``
- ring_masks.py      ``RingMasks``: each ring step's blocks masked by global positions
                     (causal, sliding window, packed documents), wholly masked ones skipped
- ulysses.py         ``ulysses_attention``, ``split_sequence`` (contiguous)
- llama.py           ``context_parallel(model)``: a Llama's attention through either, RoPE
                     at each token's global position (``sequence_positions``)

Docs: docs/attention.md. Demos: demos/11_ring_attention.py, demos/16_ulysses.py.
Tests: tests/parallel/context/.
"""
from minidist.parallel.context.ring_attention import (RingAttention, plan_work, ring_attention,
                                                      shard_sequence, unshard_sequence)
from minidist.parallel.context.ulysses import split_sequence, ulysses_attention
from minidist.parallel.context.llama import (average_gradients, context_parallel,
                                             sequence_positions, shard_tokens)

__all__ = ["ring_attention", "RingAttention", "shard_sequence", "unshard_sequence",
           "plan_work", "ulysses_attention", "split_sequence", "context_parallel",
           "sequence_positions", "shard_tokens", "average_gradients"]
