"""Parallel training strategies, each built on minidist.distributed's send/recv and collectives.

- context.py   context parallelism: ring attention (``ring_attention``), zigzag sharding
- tp_comm.py, tensor.py, tensor_vocab.py, tp_gpt.py   tensor parallelism (Megatron's f and g,
               column / row parallel layers, vocab-parallel embedding and cross-entropy,
               sequence parallelism, the tensor-parallel GPT)
"""
from minidist.parallel.context import (RingAttention, plan_work, ring_attention, shard_sequence,
                                       unshard_sequence)
from minidist.parallel.tensor import (ColumnParallelLinear, ParallelMLP, ParallelSelfAttention,
                                      RowParallelLinear, SequenceParallelLayerNorm,
                                      shard_state_dict)
from minidist.parallel.tensor_vocab import (VocabParallelEmbedding, vocab_parallel_cross_entropy,
                                            vocab_range)
from minidist.parallel.tp_comm import (copy_to_tp, gather_from_sp, gather_from_tp,
                                       reduce_from_tp, reduce_scatter_to_sp, split_to_tp)
from minidist.parallel.tp_gpt import ParallelBlock, TensorParallelGPT

__all__ = ["ring_attention", "RingAttention", "shard_sequence", "unshard_sequence", "plan_work",
           # tensor parallelism
           "copy_to_tp", "reduce_from_tp", "gather_from_tp", "split_to_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelSelfAttention", "SequenceParallelLayerNorm", "shard_state_dict",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "vocab_range",
           "ParallelBlock", "TensorParallelGPT"]
