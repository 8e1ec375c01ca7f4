"""Parallel training strategies, one subpackage each, built on minidist.distributed.

Every strategy reproduces single-process training (tests/parallel/ says to what
tolerance); each subpackage's docstring is its map (idea, formula, files in reading order).

- data/      data parallelism: naive and bucketed-overlapped DDP, the sampler, the sync check
- zero/      ZeRO stages 1, 2 and 3: sharded optimizer state, gradients and weights
- tensor/    tensor parallelism (Megatron's f and g, column / row layers, vocab-parallel
             embedding and cross-entropy, sequence parallelism, the tensor-parallel GPT)
- pipeline/  pipeline parallelism (schedules as data, the executor, GPT pieces)
- context/   context parallelism: ring attention, zigzag sharding, Ulysses (all-to-all)
- expert/    expert parallelism: MoE experts spread over ranks, tokens moved by all-to-all
- diloco/    DiLoCo and Streaming DiLoCo: H local steps per replica, then an outer step on
             the averaged outer gradient (fragments, delay, mixing, quantised outer gradients)
- compare/   one model, seed and batches under two layouts: per-step losses in ulps and the
             first gradient or parameter where they part (``minidist compare``); and one
             layout's step time and peak memory per rank (``minidist plan --measure``)
- compose/   every dimension on one mesh: ``ParallelDims`` (the degrees, checked, and the
             named world mesh: ep borrows dp_shard x cp; dp_cp, dp_shard_cp) and
             ``parallelize_llama`` (tp, cp, ep, the pipeline and FSDP / HSDP composed on
             it, in torchtitan's order)
- three_d.py      data x pipeline x tensor parallelism on one device mesh (``ThreeDParallelGPT``):
                  the composition with cp = ep = 1 and no dp_shard
- diagnostics.py  what to ask a data-parallel run whose numbers look wrong
- clip.py         ``clip_grad_norm_`` of a tensor / pipeline / 3D-parallel model: the whole
                  model's gradient norm, each parameter counted once

One strategy imports another only where it builds on it: ZeRO on data; the composition
(compose/, and 3D on it) on tensor, context, expert, pipeline, data and fully_shard
(tests/test_layering.py).
"""
from minidist.parallel.clip import clip_grad_norm_, parameters_to_count
from minidist.parallel.context import (RingAttention, plan_work, ring_attention,
                                       shard_sequence, split_sequence, ulysses_attention,
                                       unshard_sequence)
from minidist.parallel.data import (DataParallelNaive, DistributedDataParallel,
                                    DistributedSampler, amax_reduce, found_inf_reduce,
                                    verify_parameter_sync)
from minidist.parallel.pipeline import (GPTPiece, Op, PipelineStats, gpipe, interleaved,
                                        make_schedule, measured_bubble, one_f_one_b,
                                        counted_parameters, pieces_of_rank, pipeline_parameters,
                                        render_timeline,
                                        run_pipeline, simulate, split_gpt, split_layers,
                                        sync_tied_gradients)
from minidist.parallel.pipeline import (chunks_per_rank, dualpipe_v, placement, zb_h1, zb_h2,
                                       zb_v)
from minidist.parallel.tensor import (ColumnParallelLinear, ParallelBlock, ParallelMLP,
                                      ParallelSelfAttention, RowParallelLinear,
                                      SequenceParallelLayerNorm, TensorParallelGPT,
                                      TensorParallelLlama,
                                      VocabParallelEmbedding, copy_to_tp, gather_from_sp,
                                      gather_from_tp, reduce_from_tp, reduce_scatter_to_sp,
                                      shard_state_dict, sharded_parameters, split_to_tp,
                                      vocab_parallel_cross_entropy,
                                      vocab_range)
from minidist.parallel.diloco import DiLoCo
from minidist.parallel.expert import (ExpertMesh, ExpertParallelMoE, expert_parallel,
                                      sync_expert_parallel_gradients)
from minidist.parallel.compose import (ParallelDims, ParallelDimsError, ParallelLlama,
                                       parallelize_gpt, parallelize_llama)
from minidist.parallel.three_d import ThreeDParallelGPT
from minidist.parallel.zero import Zero1, Zero2, Zero3

__all__ = ["DataParallelNaive", "DistributedDataParallel", "verify_parameter_sync",
           "DistributedSampler", "Zero1", "Zero2", "Zero3", "found_inf_reduce", "amax_reduce",
           "ring_attention", "RingAttention", "shard_sequence", "unshard_sequence", "plan_work",
           "ulysses_attention", "split_sequence",
           # tensor parallelism
           "copy_to_tp", "reduce_from_tp", "gather_from_tp", "split_to_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelSelfAttention", "SequenceParallelLayerNorm", "shard_state_dict",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy", "vocab_range",
           "ParallelBlock", "TensorParallelGPT", "TensorParallelLlama",
           # pipeline parallelism
           "Op", "gpipe", "one_f_one_b", "interleaved", "make_schedule", "simulate",
           "render_timeline", "run_pipeline", "PipelineStats", "measured_bubble", "split_layers",
           "GPTPiece", "split_gpt", "pieces_of_rank", "pipeline_parameters",
           "sync_tied_gradients", "counted_parameters", "zb_h1", "zb_h2", "zb_v", "dualpipe_v",
           "chunks_per_rank", "placement", "ThreeDParallelGPT",
           # every dimension on one mesh
           "ParallelDims", "ParallelDimsError", "parallelize_llama", "parallelize_gpt",
           "ParallelLlama",
           # DiLoCo (local SGD with an outer optimizer)
           "DiLoCo",
           # expert parallelism
           "ExpertMesh", "ExpertParallelMoE", "expert_parallel",
           "sync_expert_parallel_gradients",
           # clipping a model split by tensor / pipeline parallelism
           "clip_grad_norm_", "parameters_to_count", "sharded_parameters"]
