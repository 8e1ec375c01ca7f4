"""Tensor parallelism (Megatron-LM, Shoeybi et al., 2019): each weight matrix split over t ranks.

An MLP Y = GeLU(X A) B splits A by columns and B by rows, so each rank computes its
slice with no communication in between, and one all-reduce (g) sums the partial
outputs; its conjugate f copies X forward and sums the gradient backward:

    one all-reduce per MLP and per attention block, forward and backward each

Files, in reading order:

- mappings.py  Megatron's f and g (and the gathers and splits, sequence parallel's
               reduce-scatter / all-gather) as autograd ops
- (async TP's ``fused_all_gather_matmul`` and ``fused_matmul_reduce_scatter``, the gather /
  reduce-scatter as a ring overlapped with the matmul, live in
  distributed/_symmetric_memory/ as torch's do, so that parallelize_module can use them
  too; re-exported here)
- layers.py    ``ColumnParallelLinear``, ``RowParallelLinear``, ``ParallelMLP``,
               ``ParallelSelfAttention``, ``SequenceParallelLayerNorm``;
               ``sharded_parameters`` (which are split, which replicated)
- vocab.py     ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy``
- gpt.py       ``TensorParallelGPT``: the small GPT with every block split
- llama.py     ``TensorParallelLlama``: the Llama with its linear layers swapped for their
               parallel twins (GQA: nkv/t key/value heads per rank)

Docs: docs/tensor_parallel.md. Demo: demos/06_tensor_parallel.py.
Tests: tests/parallel/tensor/.
"""
from minidist.distributed._symmetric_memory import (fused_all_gather_matmul,
                                                    fused_matmul_reduce_scatter)
from minidist.parallel.tensor.gpt import ParallelBlock, TensorParallelGPT
from minidist.parallel.tensor.layers import (ColumnParallelLinear, ParallelMLP,
                                             ParallelSelfAttention, RowParallelLinear,
                                             SequenceParallelLayerNorm, shard_state_dict,
                                             sharded_parameters)
from minidist.parallel.tensor.llama import SequenceParallelRMSNorm, TensorParallelLlama
from minidist.parallel.tensor.mappings import (copy_to_tp, gather_from_sp, gather_from_tp,
                                               reduce_from_tp, reduce_scatter_to_sp, split_to_tp)
from minidist.parallel.tensor.vocab import (VocabParallelEmbedding,
                                            vocab_parallel_cross_entropy, vocab_range)

__all__ = ["copy_to_tp", "reduce_from_tp", "gather_from_tp", "split_to_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelSelfAttention", "SequenceParallelLayerNorm", "shard_state_dict", "sharded_parameters",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "vocab_range",
           "ParallelBlock", "TensorParallelGPT", "TensorParallelLlama", "SequenceParallelRMSNorm",
           "fused_all_gather_matmul", "fused_matmul_reduce_scatter"]
