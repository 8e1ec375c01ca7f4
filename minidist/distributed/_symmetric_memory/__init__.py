"""Collectives fused with the matmul beside them (torch's ``torch.distributed._symmetric_memory``).

    fused_all_gather_matmul(a_shard, [b], gather_dim, group)   -> (AG(a), [AG(a) @ b])
    fused_matmul_reduce_scatter(a, b, "sum", scatter_dim, group) -> RS(a @ b)

Each runs as a ring whose transfers overlap the chunk products: async tensor parallelism.
Torch builds them on symmetric memory (every rank maps its peers' buffers); here they are
rings of isend / irecv. They sit under distributed/ so that both the Megatron layers
(parallel/tensor/layers.py, ``async_tp=True``) and the DTensor styles
(``parallelize_module(..., async_tp=True)``, distributed/tensor/parallel/) can use them.

Files, in reading order:

- ring_matmul.py  the rings on arrays: one direction, then both (the scaling book's exercise)
- async_tp.py     the two ops as autograd Functions (each is the other's backward)

Docs: docs/tensor_parallel.md ("Async TP"). Tests: tests/parallel/tensor/test_async_tp.py,
tests/distributed/test_parallelize_async_tp.py.
"""
from minidist.distributed._symmetric_memory.async_tp import (fused_all_gather_matmul,
                                                            fused_matmul_reduce_scatter)

__all__ = ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"]
