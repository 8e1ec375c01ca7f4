"""ZeRO (Rajbhandari et al., 2020): data parallelism that shards what every replica repeats.

With Adam in mixed precision a parameter costs 16 bytes on every DDP rank (2 weights,
2 gradients, 12 optimizer state). ZeRO cuts the repeated parts into N flat shards:

    bytes per parameter   DDP 16   ZeRO-1 4 + 12/N   ZeRO-2 2 + 14/N   ZeRO-3 16/N

Files, in reading order:

- shard.py         ``FlatLayout``: parameters laid end to end, padded, cut in N shards
- zero12.py        ``Zero1`` (optimizer state sharded), ``Zero2`` (gradients too)
- zero3.py         ``Zero3``: weights sharded too, gathered unit by unit (FSDP-like)
- gather_timeline.py  when each unit's gather ran vs the compute that needed it
- memory.py        per-rank bytes counted from the arrays a rank holds
- memory_probe.py  the measurement the formulas describe (after a step and a backward)

ZeRO builds on data parallelism (its buckets and broadcast, parallel/data/).
Docs: docs/zero.md. Demo: demos/05_zero.py. Tests: tests/parallel/zero/.
"""
from minidist.parallel.zero.zero12 import Zero1, Zero2
from minidist.parallel.zero.zero3 import Zero3

__all__ = ["Zero1", "Zero2", "Zero3"]
