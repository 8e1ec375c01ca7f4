"""minidist.distributed.fsdp: FSDP2's fully_shard (torch's names).

    fully_shard.py  fully_shard, MixedPrecisionPolicy, sharded_state_dict: every parameter
                    a Shard(0) DTensor, all-gathered around its unit's use, its gradient
                    reduce-scattered; ZeRO-3 with per-parameter pieces instead of flat ones

The flat-buffer version of the same idea is minidist.parallel.zero.Zero3.
"""
from minidist.distributed.fsdp.fully_shard import (FSDPState, MixedPrecisionPolicy, fully_shard,
                                                   sharded_state_dict)

__all__ = ["fully_shard", "MixedPrecisionPolicy", "FSDPState", "sharded_state_dict"]
