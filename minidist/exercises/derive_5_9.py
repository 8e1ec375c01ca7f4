"""The workbook's Derive exercises, chapters 5-9: pipelines, tensor parallelism,
checkpoints, mixed precision and the Llama 405B capstone.

Same form as derive.py (which has the class and chapters 0-4). Four printed
answers are wrong (5.2, 6.2, 8.5, and 9.9's kWh, whose rounded answer stands):
for them the exercise asks for the corrected number and names the workbook's
slip when that is the answer given (docs/cost_models.md, "Where the source
numbers are wrong").
"""
from __future__ import annotations

from minidist import calc
from minidist.calc.units import DAY, GB, MINUTE, MS, MiB
from minidist.exercises.derive import Derive

LLAMA_405B_LAYER = calc.layer_params(16384, 53248, gated=True)   # 4 d^2 + 3 d d_ff = 3.69B
TOKENS_405B = calc.training_flops(405e9, 15.6e12)                # 6 N D FLOPs


def _fp8_saving(bytes_fp16: float = 2.0, bytes_fp8: float = 1.0) -> float:
    """Workbook 8.5: sublayer inputs of a 70B model (b = 4, s = 4096, d = 8192, 80 layers)."""
    inputs = lambda nbytes: calc.layer_inputs_memory(4, 4096, 8192, 80, nbytes)  # noqa: E731
    return inputs(bytes_fp16) - inputs(bytes_fp8)


CHAPTERS_5_9 = [
    Derive("5.1", "pipeline bubble",
           "PP = 4 stages, m = 12 micro-batches, 1F1B. Bubble fraction?", "%", "25",
           lambda: 100 * calc.bubble_fraction(4, 12, "1f1b"),
           {"you divided by the whole step, (p-1)/(m+p-1), not by the useful compute":
            lambda: 100 * calc.idle_fraction(4, 12, "1f1b")}),
    Derive("5.2", "activation memory for 1F1B",
           "1F1B, PP = 4 stages, m = 12 micro-batches; one micro-batch's activations on a "
           "stage take 2 GB. Peak activation memory on the first stage?", "GB", "8",
           lambda: calc.pipeline_activation_memory(2 * GB, 4, 12, "1f1b") / GB,
           {"you stashed all m micro-batches (that is GPipe)":
            lambda: calc.pipeline_activation_memory(2 * GB, 4, 12, "gpipe") / GB},
           printed="6",
           erratum="you counted the p-1 warmup forwards only (the workbook's printed 6 GB); "
                   "the first stage runs micro-batch p's forward before micro-batch 1's "
                   "backward, so p are in flight"),
    Derive("5.3", "interleaved 1F1B",
           "PP = 4, m = 12, v = 4 virtual stages per GPU. Bubble fraction?", "%", "6.25",
           lambda: 100 * calc.bubble_fraction(4, 12, "interleaved", 4),
           {"you forgot v": lambda: 25.0}),
    Derive("5.4", "point-to-point communication",
           "Activations of 500 MB per micro-batch between stages; PP = 4, m = 12, v = 4. "
           "Total point-to-point data per step, forward and backward?", "GB", "180",
           lambda: calc.p2p_volume(0.5 * GB, 4, 12, 4) / GB,
           {"you counted the forward sends only": lambda: 90.0,
            "you used PP x v boundaries instead of PP x v - 1": lambda: 192.0}),
    Derive("6.1", "weight split shapes",
           "d = 8192, TP = 8. Column-parallel split of a [d, d] weight matrix: how many "
           "columns does each GPU hold?", "columns", "1024",
           lambda: calc.column_parallel_shard(8192, 8192, 8)[1],
           {"you split the rows (row-parallel, [d/t, d], keeps all d columns)":
            lambda: calc.row_parallel_shard(8192, 8192, 8)[1]}),
    Derive("6.2", "communication per layer",
           "TP = 8, d = 8192, s = 4096, b = 1, FP16: the activation [b s, d] is 64 MiB. "
           "How many MiB does each GPU send in one ring all-reduce of it?", "MiB", "112",
           lambda: calc.tp_all_reduce_bytes(1, 4096, 8192, 8) / MiB,
           {"you left out the (t-1)/t": lambda: 2 * 1 * 4096 * 8192 * 2 / MiB,
            "you counted the tensor in decimal MB (64 MiB is 67.1 MB)":
            lambda: calc.tp_all_reduce_bytes(1, 4096, 8192, 8) / 1e6},
           printed="56",
           erratum="you halved the ring's 2(t-1)/t M (the workbook's printed 56): that is "
                   "one phase, reduce-scatter or all-gather, of the all-reduce"),
    Derive("6.3", "TP memory savings",
           "A 70B model, d = 8192, 80 layers of 12 d^2 parameters, FP16. Weight memory "
           "per GPU with TP = 8?", "GB", "16.1",
           lambda: calc.tp_weight_bytes_per_gpu(80 * calc.layer_params(8192), 8) / GB,
           {"you did not split the weights over the TP group":
            lambda: calc.tp_weight_bytes_per_gpu(80 * calc.layer_params(8192), 1) / GB,
            "you used 4 bytes per parameter (FP32)":
            lambda: calc.tp_weight_bytes_per_gpu(80 * calc.layer_params(8192), 8, 4.0) / GB}),
    Derive("6.5", "TP scaling limit",
           "320 TP all-reduces per step of 0.09 ms each; compute takes 300 ms. TP "
           "communication overhead?", "%", "9.6",
           lambda: 100 * calc.comm_compute_ratio(320 * 0.09 * MS, 300 * MS),
           {"you counted the forward's all-reduces only (backward has as many)":
            lambda: 100 * calc.tp_overhead(0.09 * MS, 80, 300 * MS, passes=1)}),
    Derive("7.1", "checkpoint size for 70B",
           "70B parameters, mixed-precision Adam. Checkpoint size: FP16 weights, FP32 "
           "master weights, FP32 momentum and variance (the step counter and LR, 8 bytes, "
           "are negligible)?", "GB", "980",
           lambda: calc.checkpoint_bytes(70e9, extra_bytes=8) / GB,
           {"you saved the gradients too (they are not in a checkpoint)":
            lambda: calc.zero_memory_per_gpu(70e9, 1, 0) / GB,
            "you left out the FP32 master weights": lambda: 70e9 * (2 + 4 + 4) / GB}),
    Derive("7.2", "checkpoint write time",
           "A 980 GB checkpoint, written at 10 GB/s. How long?", "s", "98",
           lambda: calc.checkpoint_write_seconds(980 * GB, 10 * GB)),
    Derive("7.3", "optimal checkpoint frequency",
           "MTBF 24 hours, checkpoint C = 98 s. Young's interval sqrt(2 C F), in minutes?",
           "minutes", "68.5", lambda: calc.young_interval(98, 24 * 3600) / 60,
           {"you left out the 2 under the root": lambda: calc.young_interval(49, 24 * 3600) / 60}),
    Derive("7.4", "wasted compute on a crash",
           "512 GPUs at $2 per GPU-hour, a checkpoint every 68.5 minutes, 2 minutes to "
           "recover (reload and warm up). Dollars lost per crash, on average?", "dollars",
           "618", lambda: calc.failure_cost(512, 2.0, 68.5 * MINUTE, 2 * MINUTE),
           {"you left out the recovery time":
            lambda: calc.failure_cost(512, 2.0, 68.5 * MINUTE),
            "you lost a whole interval; a crash comes halfway through one on average":
            lambda: calc.failure_cost(512, 2.0, 2 * 68.5 * MINUTE, 2 * MINUTE)}),
    Derive("8.1", "FP16 range",
           "FP16's smallest positive normal number is 2^-14. How many x 1e-5?", "x 1e-5",
           "6.1035", lambda: calc.format_min_normal(5) * 1e5,
           {"you computed the smallest subnormal 2^-24": lambda: calc.format_min_subnormal(5, 10) * 1e5}),
    Derive("8.3", "memory of mixed precision",
           "Bytes per parameter of mixed-precision Adam over pure FP32 Adam: the ratio?", "",
           "1.0", lambda: calc.model_state_bytes_per_param(precision="mixed")
           / calc.model_state_bytes_per_param(precision="fp32"),
           {"you left out the FP32 master weights": lambda: 0.75}),
    Derive("8.5", "FP8 memory savings",
           "A 70B model keeps 2 x b x s x d values per layer for the backward (the inputs "
           "to attention and to the FFN); b = 4, s = 4096, d = 8192, 80 layers. How many "
           "GB does storing them in FP8 instead of FP16 save?", "GB", "21.47",
           lambda: _fp8_saving() / GB,
           {"you gave the FP16 total, not the saving": lambda: _fp8_saving(2.0, 0.0) / GB,
            "you answered in GiB (2^30 bytes); GB here is 1e9": lambda: _fp8_saving() / 2**30},
           printed="172",
           erratum="you multiplied by 8 (the workbook's printed 172: its '42.95 GB x 2 = "
                   "343' is x 8, and the 2 tensors per layer are already counted)"),
    Derive("9.1", "verify TP x PP x DP",
           "TP = 8, PP = 16, 16384 GPUs. DP degree?", "", "128",
           lambda: calc.data_parallel_degree(16384, 8, 16),
           {"you left out PP": lambda: calc.data_parallel_degree(16384, 8, 1),
            "you left out TP": lambda: calc.data_parallel_degree(16384, 1, 16)}),
    Derive("9.2", "layers per pipeline stage",
           "126 layers on PP = 16 stages, as evenly as possible. How many layers on the "
           "stages with more?", "layers", "8", lambda: max(calc.layers_per_stage(126, 16)),
           {"you rounded 126 / 16 = 7.875 down (those are the short stages)":
            lambda: min(calc.layers_per_stage(126, 16))}),
    Derive("9.3", "weight memory per GPU",
           "Llama 405B: d = 16384, SwiGLU d_ff = 53248, 4 d^2 + 3 d d_ff = 3.69B parameters "
           "per layer. 8 layers per stage, TP = 8. FP16 weight memory per GPU?", "GB", "7.38",
           lambda: calc.tp_weight_bytes_per_gpu(8 * LLAMA_405B_LAYER, 8) / GB,
           {"you did not split over TP": lambda: calc.tp_weight_bytes_per_gpu(8 * LLAMA_405B_LAYER, 1) / GB,
            "you used 2 d d_ff for the FFN (SwiGLU has 3 matrices)":
            lambda: calc.tp_weight_bytes_per_gpu(8 * (4 + 2 * 53248 / 16384) * 16384**2, 8) / GB}),
    Derive("9.4", "total FLOPs for training",
           "6 N D FLOPs, N = 405B, D = 15.6T tokens; 1 PF-day = 8.64e19 FLOPs. How many "
           "thousand petaFLOP-days?", "thousand PF-days", "439",
           lambda: calc.petaflop_days(TOKENS_405B) / 1e3,
           {"you counted 2 N D (the forward only)": lambda: calc.petaflop_days(TOKENS_405B / 3) / 1e3,
            "you left out the 6": lambda: calc.petaflop_days(TOKENS_405B / 6) / 1e3}),
    Derive("9.5", "training time estimate",
           "16384 H100s at 989 TFLOP/s (BF16), 40% MFU, 6 N D FLOPs for N = 405B, "
           "D = 15.6T. How many days?", "days", "67.7",
           lambda: calc.training_seconds(TOKENS_405B, 16384, 989e12, 0.40) / DAY,
           {"you left out the MFU (that is the peak)":
            lambda: calc.training_seconds(TOKENS_405B, 16384, 989e12, 1.0) / DAY}),
    Derive("9.6", "pipeline bubble for 405B",
           "PP = 16, m = 4 micro-batches per step, interleaved 1F1B with v = 2. Bubble "
           "fraction, (p-1)/(m v)?", "%", "187.5",
           lambda: 100 * calc.bubble_fraction(16, 4, "interleaved", 2),
           {"you forgot v": lambda: 100 * calc.bubble_fraction(16, 4, "1f1b"),
            "you divided by the whole step, not by the useful compute":
            lambda: 100 * calc.idle_fraction(16, 4, "interleaved", 2)}),
    Derive("9.7", "DP all-reduce volume",
           "Each GPU holds 3.69B parameters (8 layers, TP-sharded by 8); FP16 gradients; "
           "DP = 128. GB each GPU sends in the ring all-reduce of its gradients?", "GB",
           "14.65", lambda: calc.ring_all_reduce_bytes(3.69e9 * 2, 128) / GB,
           {"you counted one phase only": lambda: calc.all_gather_bytes(3.69e9 * 2, 128) / GB,
            "you used FP32 gradients": lambda: calc.ring_all_reduce_bytes(3.69e9 * 4, 128) / GB}),
    Derive("9.9", "electricity cost",
           "16384 GPUs at 700 W each for 77 days, $0.05 per kWh, GPU power only. "
           "Cost in millions of dollars?", "million dollars", "1.06",
           lambda: calc.electricity_cost(16384, 700, 77 * 24, 0.05) / 1e6,
           {"you took 77 hours, not 77 days x 24 h":
            lambda: calc.electricity_cost(16384, 700, 77, 0.05) / 1e6,
            "you added the facility's overhead (PUE 1.4); the question asks for GPU power":
            lambda: calc.electricity_cost(16384, 700, 77 * 24, 0.05, pue=1.4) / 1e6}),
]
