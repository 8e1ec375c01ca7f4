"""Parallel training strategies, each built on minidist.distributed's send/recv and collectives.

- context.py   context parallelism: ring attention (``ring_attention``), zigzag sharding
"""
from minidist.parallel.context import (RingAttention, plan_work, ring_attention, shard_sequence,
                                       unshard_sequence)

__all__ = ["ring_attention", "RingAttention", "shard_sequence", "unshard_sequence", "plan_work"]
