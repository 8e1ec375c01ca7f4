"""minidist.distributed.tensor: DTensor and its placements (torch.distributed.tensor's names).

Files, in reading order:

    placement_types.py  Shard(dim), Replicate(), Partial(op); torch.chunk's uneven pieces
    _collectives.py     one change of placement on one mesh dim = one collective, its bytes
    _redistribute.py    the steps from one list of placements to another; the autograd op
    _api.py             DTensor, distribute_tensor, DTensor.from_local / to_local /
                        full_tensor / redistribute
    _ops/               sharding propagation: matmul, add / sub / mul, sum / mean,
                        softmax, norms, embedding, reshape / transpose / permute; the
                        fallback to Replicate with a warning (its __init__ lists the files)
    parallel/           parallelize_module and its styles (its __init__ lists the files)
    debug/              CommDebugMode, visualize_sharding

    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import DTensor, Shard, Replicate, distribute_tensor
"""
from minidist.distributed.device_mesh import DeviceMesh, init_device_mesh
from minidist.distributed.tensor._api import DTensor, distribute_tensor
from minidist.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "distribute_tensor", "Shard", "Replicate", "Partial", "Placement",
           "DeviceMesh", "init_device_mesh"]
