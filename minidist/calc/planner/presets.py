"""What the planner plans for: a model, a cluster, a training setup, and their presets.

A model is the handful of sizes the cost models need (Hugging Face's
``LlamaConfig`` names in the comments); a cluster is GPUs, how they are grouped
in nodes, and how fast each computes and talks. Presets hold published
configurations, so that ``minidist plan --model llama3-405b --cluster
h100-nvlink-ib --gpus 16384`` needs no sizes typed in.

Sources of the presets:
    llama3-8b / 70b / 405b   Llama 3 report (Dubey et al. 2024), Table 3, and the
                             released config.json files (vocabulary 128,256)
    gpt3-175b                Brown et al. 2020, Table 2.1 (96 layers, h = 12288)
    megatron-*               Narayanan et al. 2021, Table 1 (vocabulary 51,200, s = 2048)
    mixtral-8x7b             Mistral's released config.json (8 experts, top-2)
    a100 / h100 clusters     NVIDIA data sheets: BF16 dense 312 / 989 TFLOP/s,
                             NVLink 300 / 450 GB/s per GPU each way, one 200 / 400 Gb/s
                             InfiniBand NIC per GPU (25 / 50 GB/s)
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int               # num_hidden_layers
    hidden: int               # hidden_size
    heads: int                # num_attention_heads
    kv_heads: int             # num_key_value_heads (= heads without GQA)
    ffn_hidden: int           # intermediate_size (4 h for a GPT)
    vocab: int                # vocab_size
    gated: bool = True        # SwiGLU (3 matrices) vs GELU MLP (2)
    tied: bool = False        # tie_word_embeddings
    positions: int = 0        # learned position embeddings (a GPT: its sequence length)
    biases: bool = False      # a GPT's linears and LayerNorms carry biases
    dropout: bool = False     # keeps dropout masks for backward (Korthikanti's 5as/h, sbh)
    experts: int = 0          # routed experts per MoE layer (0: dense)
    top_k: int = 0            # routed experts per token
    shared_experts: int = 0   # DeepSeek-style experts every token runs through
    expert_ffn_hidden: int = 0  # width of one expert (0: ffn_hidden)
    # whose layer keeps what for backward: "megatron" (Korthikanti et al. 2022, flash
    # attention) or "minidist" (nn.gpt.Block: naive attention, GELU's tanh kept;
    # calc.activations.minidist_layer_activation_bytes), for `plan --measure`
    implementation: str = "megatron"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 0


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpus_per_node: int
    memory: float             # bytes of memory per GPU
    peak_flops: float         # dense BF16 FLOP/s per GPU
    intra_bandwidth: float    # bytes/s per GPU inside a node (NVLink, one direction)
    inter_bandwidth: float    # bytes/s per GPU between nodes (its NIC)
    intra_latency: float = 5e-6     # seconds per message inside a node
    inter_latency: float = 10e-6    # seconds per message between nodes
    # the share of peak a well-shaped matmul reaches: compute time = FLOPs / (peak x this).
    # An assumption, not a law: `minidist plan --measure` calibrates it on this machine
    matmul_efficiency: float = 0.6
    # seconds of fixed cost per layer and micro-batch (forward + backward) besides the
    # FLOPs: the op dispatch a small model on a CPU pays (`plan --measure` fits it; 0 on GPUs)
    layer_overhead: float = 0.0


MODELS = {
    "llama3-8b": ModelSpec("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama3-70b": ModelSpec("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    "llama3-405b": ModelSpec("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000,
                              experts=8, top_k=2),
    "gpt3-175b": ModelSpec("gpt3-175b", 96, 12288, 96, 96, 4 * 12288, 51200, gated=False,
                           tied=True, positions=2048, biases=True, dropout=True),
}
# Narayanan et al. 2021, Table 1: GPT models of 1.7B to 1T parameters
for _name, _heads, _hidden, _layers in (("megatron-1.7b", 24, 2304, 24),
                                        ("megatron-3.6b", 32, 3072, 30),
                                        ("megatron-7.5b", 32, 4096, 36),
                                        ("megatron-18b", 48, 6144, 40),
                                        ("megatron-39b", 64, 8192, 48),
                                        ("megatron-76b", 80, 10240, 60),
                                        ("megatron-145b", 96, 12288, 80),
                                        ("megatron-310b", 128, 16384, 96),
                                        ("megatron-530b", 128, 20480, 105),
                                        ("megatron-1t", 160, 25600, 128)):
    MODELS[_name] = ModelSpec(_name, _layers, _hidden, _heads, _heads, 4 * _hidden, 51200,
                              gated=False, tied=True, positions=2048, biases=True,
                              dropout=True)

GB = 1e9
CLUSTERS = {
    "h100-nvlink-ib": ClusterSpec("h100-nvlink-ib", 8, 80 * GB, 989e12, 450 * GB, 50 * GB,
                                  matmul_efficiency=0.55),
    "a100-nvlink-ib": ClusterSpec("a100-nvlink-ib", 8, 80 * GB, 312e12, 300 * GB, 25 * GB,
                                  matmul_efficiency=0.6),
    "a100-40gb-nvlink-ib": ClusterSpec("a100-40gb-nvlink-ib", 8, 40 * GB, 312e12, 300 * GB,
                                       25 * GB, matmul_efficiency=0.6),
}


@dataclass(frozen=True)
class TrainingSetup:
    global_batch_tokens: int   # tokens per optimizer step, over the whole cluster
    seq: int                   # sequence length
    precision: str = "mixed"   # "mixed" (bf16 weights, fp32 master + Adam) or "fp32"

    @property
    def sequences(self) -> int:
        return self.global_batch_tokens // self.seq


def model_preset(name: str) -> ModelSpec:
    """The preset called ``name``; a ValueError listing the known ones otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model preset {name!r}: one of {', '.join(sorted(MODELS))}")
    return MODELS[name]


def cluster_preset(name: str, **overrides) -> ClusterSpec:
    """The preset called ``name`` with any field replaced (``memory=40e9``)."""
    if name not in CLUSTERS:
        raise ValueError(f"unknown cluster preset {name!r}: one of "
                         f"{', '.join(sorted(CLUSTERS))}")
    return replace(CLUSTERS[name], **overrides)
