"""minidist.distributed: the torch.distributed-shaped facade (re-exports only).

    import minidist.distributed as dist

    dist.init_process_group()              # RANK / WORLD_SIZE from minidist run, or mpiexec
    x = backend.xp.ones(4) * dist.get_rank()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    dist.destroy_process_group()

The collectives live in minidist/comm/. Beside the facade, torch's newer paths, in
reading order:

    device_mesh.py      init_device_mesh: an n-D grid of ranks with named dimensions
    tensor/             DTensor and its placements (Shard, Replicate, Partial), redistribute
                        as collectives; tensor/parallel: parallelize_module and its styles;
                        tensor/debug: CommDebugMode, visualize_sharding
    fsdp/               fully_shard (FSDP2): parameters as Shard(0) DTensors, the next
                        unit prefetched
    _shared_tokens.py   which ranks share a batch's tokens: the groups every strategy that
                        splits tokens registers, over which the MoE routers sum their counts

They build on comm, autograd and nn and sit at the level of minidist.parallel (DESIGN.md);
this file imports only comm, so ``import minidist.distributed as dist`` stays light.
"""
from minidist.comm import (NON_GROUP_MEMBER, CollectiveMismatchError, CommError,
                           CommTimeoutError, DeviceMesh, MessageMismatchError, ProcessGroup,
                           RankFailedError, ReduceOp, Work, WorldAbortedError, all_gather,
                           all_gather_into_tensor, all_reduce, all_to_all, barrier, broadcast,
                           destroy_process_group, gather, get_rank, get_world_size,
                           init_process_group, irecv, is_initialized, isend, launch, launched,
                           new_group,
                           recv, recv_reduce, reduce, reduce_scatter, reduce_scatter_tensor,
                           scatter, send)
from minidist.comm import all_to_all_single
from minidist.comm.group import get_link_bytes, get_node_local_rank, get_stats, get_topology


__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank",
           "get_world_size", "new_group", "ProcessGroup", "NON_GROUP_MEMBER", "DeviceMesh",
           "ReduceOp", "Work", "send", "recv", "isend", "irecv", "recv_reduce", "broadcast",
           "reduce", "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
           "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "barrier", "launch",
           "launched",
           "get_stats", "get_link_bytes", "CommError", "CommTimeoutError", "CollectiveMismatchError",
           "MessageMismatchError", "RankFailedError", "WorldAbortedError"]
__all__ += ["all_to_all_single", "get_node_local_rank", "get_topology"]
