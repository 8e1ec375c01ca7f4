"""Parallel training strategies, each built on minidist.distributed's send/recv and collectives.

- ddp_naive.py, ddp.py (buckets.py, ddp_check.py), sampler.py   data parallelism: naive and
               bucketed-overlapped DDP, no_sync, the parameter-sync check, DistributedSampler
- zero.py (stages 1, 2), zero3.py, shard.py, zero_memory.py, memory_probe.py   ZeRO: sharded optimizer state,
               gradients and weights, per-rank bytes
- context.py   context parallelism: ring attention (``ring_attention``), zigzag sharding
- tp_comm.py, tensor.py, tensor_vocab.py, tp_gpt.py   tensor parallelism (Megatron's f and g,
               column / row parallel layers, vocab-parallel embedding and cross-entropy,
               sequence parallelism, the tensor-parallel GPT)
- pipeline_schedule.py, pipeline.py, pipeline_gpt.py   pipeline parallelism (GPipe, 1F1B and
               interleaved schedules as data, the executor, measured bubbles, GPT pieces)
- three_d.py   data x pipeline x tensor parallelism on one device mesh (``ThreeDParallelGPT``)
"""
from minidist.parallel.ddp import DistributedDataParallel
from minidist.parallel.ddp_check import verify_parameter_sync
from minidist.parallel.ddp_naive import DataParallelNaive, found_inf_reduce
from minidist.parallel.sampler import DistributedSampler
from minidist.parallel.zero import Zero1, Zero2
from minidist.parallel.zero3 import Zero3
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
from minidist.parallel.pipeline import PipelineStats, measured_bubble, run_pipeline, split_layers
from minidist.parallel.pipeline_gpt import (GPTPiece, pieces_of_rank, pipeline_parameters,
                                            split_gpt, sync_tied_gradients)
from minidist.parallel.pipeline_schedule import (Op, gpipe, interleaved, make_schedule,
                                                 one_f_one_b, render_timeline, simulate)
from minidist.parallel.three_d import ThreeDParallelGPT

__all__ = ["DataParallelNaive", "DistributedDataParallel", "verify_parameter_sync",
           "DistributedSampler", "Zero1", "Zero2", "Zero3", "found_inf_reduce",
           "ring_attention", "RingAttention", "shard_sequence", "unshard_sequence", "plan_work",
           # tensor parallelism
           "copy_to_tp", "reduce_from_tp", "gather_from_tp", "split_to_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelSelfAttention", "SequenceParallelLayerNorm", "shard_state_dict",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "vocab_range",
           "ParallelBlock", "TensorParallelGPT",
           # pipeline parallelism
           "Op", "gpipe", "one_f_one_b", "interleaved", "make_schedule", "simulate",
           "render_timeline", "run_pipeline", "PipelineStats", "measured_bubble", "split_layers",
           "GPTPiece", "split_gpt", "pieces_of_rank", "pipeline_parameters",
           "sync_tied_gradients", "ThreeDParallelGPT"]
