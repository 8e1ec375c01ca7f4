"""minidist.distributed.fsdp: FSDP2's fully_shard (torch's names).

    fully_shard.py  fully_shard, sharded_state_dict: every parameter
                    a Shard(0) DTensor, all-gathered around its unit's use, its gradient
                    reduce-scattered; ZeRO-3 with per-parameter pieces instead of flat ones
    hsdp.py         fully_shard on a 2-D mesh (HSDP): (Replicate(), Shard(0)), the gradients
                    reduce-scattered inside a replica and all-reduced across replicas
    state.py        FSDPState (a unit's pieces, gathers and reduce), the prefetch of the next
                    unit, MixedPrecisionPolicy, the smaller group of reshard_after_forward=k
    pre_backward.py  a kept unit's (the root's) first output gradient issues the backward
                    gather of the unit before it: the last block's travels during the head's
    post_backward.py  the gradients' reduce-scatter left in flight while the units before
                    compute, waited in issue order, written into .grad when backward ends
    gather_format.py  the parameters' all-gather in a low-precision format: cast before it
                    (bf16 codes: half the bytes), or e4m3 codes with a scale per piece
    reduce_format.py  the gradients' reduce-scatter in an emulated format (bf16, fp16, ...),
                    every partial sum rounded as on hardware
    ties.py         a tied weight belongs to one unit: a second unit cutting it is refused
    names.py        a unit's parameters by the model's names (torch's _param_fqn), for errors

The flat-buffer version of the same idea is minidist.parallel.zero.Zero3.
"""
from minidist.distributed.fsdp.fully_shard import fully_shard, sharded_state_dict
from minidist.distributed.fsdp.state import FSDPState, MixedPrecisionPolicy

__all__ = ["fully_shard", "MixedPrecisionPolicy", "FSDPState", "sharded_state_dict"]
