"""Closed-form cost models of distributed training, as pure functions.

Numbers in, numbers out: no arrays, nothing else from minidist. Units are SI
(bytes, seconds, bytes/s, FLOPs, FLOP/s, watts, dollars); ``units`` has the
constants to convert (GB = 1e9 bytes as in the source documents, GiB = 2^30).
One module per topic; every docstring gives the formula and the worked number
it reproduces. See docs/cost_models.md.

    comm       ring / tree / naive all-reduce, all-gather, hierarchical, busbw, overlap
    memory     bytes per parameter, DDP and ZeRO 1/2/3, layer inputs, checkpoints
    activations  per layer (Korthikanti et al. 2022): TP, SP, selective / full recompute, flash
    gpt        parameters and FLOPs per iteration (Narayanan et al. 2021), MFU and HFU
    pipeline   bubble (GPipe, 1F1B, interleaved), in-flight activations, p2p volume
    tensor     shard shapes, TP all-reduce volume and overhead, 3D degrees
    compute    6PD, MFU, time, GPU-hours, PF-days, dollars, electricity, roofline
    recipes    effective batch, accumulation, LR scaling, warmup, Young's interval
    precision  format ranges, dynamic loss scaling, bits per element of block-scaled formats
    moe        MoE total vs active parameters, all-to-all bytes, Ulysses vs ring attention
    muon       sharded Muon's two schemes: bytes and Newton-Schulz FLOPs per step
    llama      a Llama's parameters (GQA, SwiGLU), training FLOPs, KV-cache bytes
    diloco     bytes per step and step time over a slow link: DDP, DiLoCo, Streaming
               DiLoCo, quantised outer gradients, Top-K, 1-bit Adam
    planner/   every parallel layout of a model on a cluster, priced with the above (plan)
"""
from minidist.calc import units
from minidist.calc.activations import (activation_memory_per_layer,
                                       activation_memory_per_layer_terms,
                                       minidist_layer_activation_bytes)
from minidist.calc.comm import (AllReduceCost, HierarchicalCost, algorithm_bandwidth,
                                all_gather_bytes, all_gather_time, all_reduce_cost,
                                bandwidth_utilization, bus_bandwidth, comm_compute_ratio,
                                comm_overhead_fraction, dp_comm_compute_ratio,
                                exposed_comm_seconds, hierarchical_all_reduce,
                                mfu_with_exposed_comm, naive_all_reduce_bytes,
                                naive_all_reduce_time, overlap_fraction, reduce_scatter_bytes,
                                ring_all_reduce_bytes, ring_all_reduce_time,
                                tree_all_reduce_time, tree_reduce_time)
from minidist.calc.muon import (MuonStepCost, gpt_block_matrices, muon_step_costs,
                                newton_schulz_flops)
from minidist.calc.compute import (achieved_flops, amdahl_speedup, arithmetic_intensity,
                                   attainable_flops, break_even_preemptions,
                                   electricity_cost, elementwise_intensity, gpu_hours,
                                   matmul_intensity, mfu, on_demand_cost, petaflop_days,
                                   ridge_point, scaling_efficiency, spot_cost,
                                   training_flops, training_seconds)
from minidist.calc.gpt import (Utilization, flops_utilization, gpt_layer_params, gpt_params,
                              mfu_from_throughput, palm_model_flops_per_token,
                              training_flops_per_iteration)
from minidist.calc.llama import (LLAMA3_8B, LLAMA3_70B, LlamaParams, kv_cache_bytes,
                                 llama_flops_per_token, llama_params, llama_training_flops)
from minidist.calc.memory import (STATE_BYTES, model_state_bytes_split, activation_memory, checkpoint_bytes,
                                  checkpoint_peak_fraction, checkpoint_stored_fraction,
                                  checkpoint_write_seconds, ddp_memory_per_gpu,
                                  layer_inputs_memory,
                                  model_state_bytes_per_param, recompute_overhead,
                                  sqrt_checkpoint_interval, zero_memory_per_gpu)
from minidist.calc.moe import (moe_all_to_all_bytes, moe_gpt_params,
                              sequence_parallel_bytes)
from minidist.calc.pipeline import (bubble_fraction, dualpipe_v_exact_idle, dualpipe_v_idle,
                                    idle_fraction, layers_per_stage,
                                    min_microbatches, p2p_volume, peak_inflight_microbatches,
                                    pipeline_activation_memory, warmup_forwards)
from minidist.calc.precision import (BLOCK_FORMATS, BlockFormat, block_format_bits,
                                     dynamic_loss_scale, format_max, format_min_normal,
                                     format_min_subnormal)
from minidist.calc.recipes import (accumulation_step_seconds, accumulation_steps,
                                   all_reduce_seconds_saved, checkpoint_overhead,
                                   critical_batch_size, effective_batch,
                                   expected_waste_fraction, failure_cost,
                                   linear_scaled_lr, lost_seconds_per_failure,
                                   sqrt_scaled_lr, warmup_steps, young_interval)
from minidist.calc.tensor import (attention_params, column_parallel_shard,
                                  data_parallel_degree, ffn_params, heads_per_rank,
                                  kv_head_replicas, kv_heads_per_rank, layer_params,
                                  row_parallel_shard, tp_all_reduce_bytes,
                                  tp_comm_bytes_per_layer, tp_overhead,
                                  tp_weight_bytes_per_gpu)
from minidist.calc.planner import plan
