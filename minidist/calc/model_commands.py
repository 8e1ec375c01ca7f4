"""The ``minidist calc`` topics of the newer models: mixture of experts and sequence
parallelism (moe.py), the Llama family (llama.py), block-scaled formats (precision.py),
training over a slow network (diloco.py) and sharded Muon (muon.py).

Each entry of ``TOPICS`` here joins ``commands.TOPICS``, the same way as the topics
written there: flags with their checks, the formula and source for --help, and a
function from the parsed flags to the lines it prints.
"""
from __future__ import annotations

from minidist.calc import diloco, llama, moe, muon, precision
from minidist.calc.cli_args import Topic, non_negative, non_negative_int, positive, positive_int

TOPICS: dict[str, Topic] = {}


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


# -- mixture of experts and sequence parallelism (calc/moe.py) ------------------------

def _moe(a):
    p = moe.moe_gpt_params(a.layers, a.hidden, a.vocab, a.experts, a.top_k, a.moe_every)
    b = moe.moe_all_to_all_bytes(a.tokens, a.hidden, a.top_k, a.ep, a.bytes_per_element)
    return [f"parameters: total {p.total / 1e9:,.3f} B, active per token {p.active / 1e9:,.3f} B "
            f"({p.moe_layers} MoE layers)",
            f"all-to-all per MoE layer and rank: {_gb(b.dispatch)} each, forward "
            f"{_gb(b.forward)}, forward + backward {_gb(b.forward_backward)}"]


def _sequence_parallel(a):
    b = moe.sequence_parallel_bytes(a.seq, a.hidden, a.ranks, a.batch, a.bytes_per_element,
                                    a.heads)
    rows = [f"Ulysses: forward {_gb(b.ulysses_forward)}, step {_gb(b.ulysses_step)} per rank",
            f"ring:    forward {_gb(b.ring_forward)}, step {_gb(b.ring_step)} per rank"]
    if not b.ulysses_possible:
        rows.append(f"Ulysses needs the heads ({a.heads}) divisible by N ({a.ranks}): use ring")
    return rows


TOPICS["moe"] = Topic(
    "MoE total vs active parameters and all-to-all bytes per layer",
    "total = dense + n_moe (E P_ffn + h E), active = dense + n_moe (k P_ffn + h E);"
    "  all-to-all = S k h B (ep-1)/ep per dispatch, 4 per step (dispatch and combine,"
    " forward and backward)",
    "Fedus et al. 2021 (Switch Transformer); Lepikhin et al. 2020 (GShard)",
    [("--layers", positive_int, None, "L"), ("--hidden", positive_int, None, "h"),
     ("--vocab", positive_int, 50257, "V"), ("--experts", positive_int, None, "E"),
     ("--top-k", positive_int, 2, "k"), ("--moe-every", positive_int, 1, ""),
     ("--tokens", positive_int, 4096, "tokens per rank S"),
     ("--ep", positive_int, 1, "expert-parallel ranks"),
     ("--bytes-per-element", positive, 2.0, "")],
    _moe)
TOPICS["sequence-parallel"] = Topic(
    "Ulysses vs ring attention bytes per rank",
    "Ulysses 4 (N-1)/N M_r, ring 2 (N-1) M_r per forward, M_r = b (s/N) h B",
    "Jacobs et al. 2023 (DeepSpeed-Ulysses); Liu et al. 2023 (ring attention)",
    [("--seq", positive_int, None, "s"), ("--hidden", positive_int, None, "h"),
     ("--ranks", positive_int, None, "N"), ("--batch", positive_int, 1, "b"),
     ("--heads", non_negative_int, 0, "H (checks N | H)"),
     ("--bytes-per-element", positive, 2.0, "")],
    _sequence_parallel)


# -- the Llama family (calc/llama.py) ---------------------------------------------------

_LLAMA_FLAGS = (("vocab", "vocab_size"), ("hidden", "hidden_size"),
                ("layers", "num_hidden_layers"), ("heads", "num_attention_heads"),
                ("kv_heads", "num_key_value_heads"), ("intermediate", "intermediate_size"))


def _llama(a):
    config = dict(llama.PRESETS[a.model]) if a.model else {}
    for flag, name in _LLAMA_FLAGS:
        if getattr(a, flag) is not None:
            config[name] = getattr(a, flag)
        elif name not in config:
            raise ValueError(f"--{flag.replace('_', '-')} is needed (or a --model)")
    if a.tie:
        config["tie_word_embeddings"] = True
    head_dim = a.head_dim or config["hidden_size"] // config["num_attention_heads"]
    p = llama.llama_params(head_dim=head_dim, **config)
    per_token = llama.llama_flops_per_token(a.seq, head_dim=head_dim, **config)
    kv = llama.kv_cache_bytes(config["num_hidden_layers"], config["num_key_value_heads"],
                              head_dim, a.seq, a.batch, a.bytes_per_element)
    kv_mha = kv * config["num_attention_heads"] / config["num_key_value_heads"]
    return [f"parameters: {p.total:,} ({p.total / 1e9:.2f} B); per layer {p.per_layer:,} "
            f"(attention {p.attention:,}, SwiGLU {p.mlp:,}); embedding {p.embedding:,}",
            f"training FLOPs per token at s = {a.seq}: {per_token:.4g}; per step of "
            f"{a.batch} x {a.seq} tokens: {per_token * a.batch * a.seq:.4g}",
            f"KV cache for {a.batch} x {a.seq} tokens: {kv / 2**30:,.3f} GiB "
            f"({kv / (a.batch * a.seq):,.0f} bytes per token); with every head's K/V "
            f"(no GQA): {kv_mha / 2**30:,.3f} GiB"]


TOPICS["llama"] = Topic(
    "a Llama's parameters, training FLOPs and KV-cache bytes (GQA, SwiGLU)",
    "P = V h + L (2 h nh d + 2 h nkv d + 3 h H + 2h) + h + V h (untied);"
    "  FLOPs/token = 6 N_mm + 12 L s nh d;  KV cache = 2 L nkv d s B bytes",
    "Touvron et al. 2023 (Llama); Ainslie et al. 2023 (GQA); Shazeer 2020 (SwiGLU);"
    " the Llama-3 8B and 70B configs give 8,030,261,248 and 70,553,706,496",
    [(("--model", "--preset"), tuple(llama.PRESETS), "",
      "a model preset, llama3-8b | llama3-70b (flags override), as in `minidist plan`"),
     ("--vocab", positive_int, "", "V"), ("--hidden", positive_int, "", "h"),
     ("--layers", positive_int, "", "L"), ("--heads", positive_int, "", "nh"),
     ("--kv-heads", positive_int, "", "nkv"), ("--intermediate", positive_int, "", "H"),
     ("--head-dim", non_negative_int, 0, "d (0: h / nh)"),
     ("--tie", bool, None, "lm_head shares the embedding"),
     ("--seq", positive_int, 8192, "s"), ("--batch", positive_int, 1, "B"),
     ("--bytes-per-element", positive, 2.0, "of the KV cache (2: bf16)")],
    _llama)
def _block_formats(a):
    names = [a.format] if a.format else list(precision.BLOCK_FORMATS)
    rows = []
    for name in names:
        bits = precision.block_format_bits(name, a.numel)
        rows.append(f"{name:>20}: {bits:.4g} bits/element, {a.numel * bits / 8:,.0f} bytes"
                    if a.numel else f"{name:>20}: {bits:.4g} bits/element (+ per-tensor scale)"
                    if precision.BLOCK_FORMATS[name].tensor_scale_bits else
                    f"{name:>20}: {bits:.4g} bits/element")
    return rows


TOPICS["block-formats"] = Topic(
    "storage bits per element of block-scaled formats (MX, NVFP4, DeepSeek-V3 FP8)",
    "bits = element_bits + scale_bits / block_size + tensor_scale_bits / numel",
    "OCP MX v1.0; NVIDIA NVFP4; DeepSeek-V3 technical report, section 3.3",
    [("--format", tuple(precision.BLOCK_FORMATS), "", "one format (default: all)"),
     ("--numel", non_negative, 0.0, "elements of the tensor (adds the per-tensor scale)")],
    _block_formats)


# -- training over a slow network (calc/diloco.py) ------------------------------------

def _diloco(a):
    costs = diloco.diloco_costs(a.params * 4, a.ranks, a.sync_every, a.fragments, a.bits,
                                a.compute_seconds, a.bandwidth, a.latency, a.delay, a.density)
    ddp = costs[0]
    rows = [f"{'strategy':<16} {'bytes/step':>12} {'peak/step':>12} {'vs DDP':>8} "
            f"{'step time':>12}"]
    for c in costs:
        rows.append(f"{c.name:<16} {_gb(c.bytes_per_step):>12} {_gb(c.peak_bytes_per_step):>12} "
                    f"{c.bytes_per_step / ddp.bytes_per_step:8.4f} {c.step_seconds * 1e3:9.3f} ms")
    rows.append(f"(float32 parameters; compute {a.compute_seconds * 1e3:g} ms per step, "
                f"link {a.bandwidth / 1e9:g} GB/s; step time = compute + exposed wire / steps "
                "between syncs)")
    return rows


TOPICS["diloco"] = Topic(
    "bytes per rank per step and step time: DDP, DiLoCo, Streaming DiLoCo, Top-K, 1-bit Adam",
    "DDP 2(N-1)/N M every step;  DiLoCo the same every H steps;  Streaming M/F every H/F "
    "steps (peak / F), exposed max(0, wire - tau c);  quantised: an all-gather of the "
    "codes, (N-1) M/F bits/32;  Top-K (N-1) k (8 + 4);  1-bit Adam ~2(N-1)/N M/32",
    "Douillard et al. 2023 (DiLoCo), 2025 (Streaming DiLoCo); Lin et al. 2018 (DGC); "
    "Tang et al. 2021 (1-bit Adam)",
    [("--params", positive, None, "parameters P (M = 4P bytes)"),
     ("--ranks", positive_int, 2, "replicas N"),
     ("--sync-every", positive_int, 100, "H inner steps per round"),
     ("--fragments", positive_int, 1, "F (H a multiple of F)"),
     ("--bits", positive_int, 4, "bits per quantised outer-gradient number"),
     ("--delay", non_negative_int, 1, "tau inner steps overlapping a fragment's sync"),
     ("--density", positive, 0.01, "Top-K: fraction of the entries sent"),
     ("--compute-seconds", non_negative, 0.1, "c: compute time of one step"),
     ("--bandwidth", positive, 12.5e9, "beta of the slowest link, bytes/s"),
     ("--latency", non_negative, 0.0, "alpha in s")],
    _diloco)
# -- sharded Muon (calc/muon.py) ----------------------------------------------------------

def _muon(a):
    shapes = muon.gpt_block_matrices(a.hidden, a.layers)
    rows = [f"{len(shapes)} matrices (GPT blocks, h = {a.hidden}), N = {a.gpus}, "
            f"{a.ns_steps} Newton-Schulz steps, {a.bytes_per_element:g} bytes per element:"]
    for c in muon.muon_step_costs(shapes, a.gpus, a.ns_steps, a.bytes_per_element):
        rows.append(f"{c.scheme:>11}: sends {_gb(c.bytes_per_rank)} per rank, busiest rank "
                    f"{c.flops_per_rank / 1e12:,.3f} TFLOP, world {c.flops_in_world / 1e12:,.3f} "
                    f"TFLOP ({c.iterations_in_world} iterations) per step")
    return rows


TOPICS["muon"] = Topic(
    "sharded Muon per step: gather vs round-robin bytes and Newton-Schulz FLOPs",
    "F_i = k (4 a^2 b + 2 a^3);  gather: (N-1)/N sum P_i B per rank, N sum F_i in the world;"
    "  round robin: 2 (N-1)/N sum P_i/N B per rank, sum F_i in the world",
    "Jordan 2024 (Muon); Liu et al. 2025 (Moonlight, arXiv 2502.16982); torchtitan dist_muon",
    [("--hidden", positive_int, None, "h"), ("--layers", positive_int, None, "L"),
     ("--gpus", positive_int, None, "N"), ("--ns-steps", positive_int, 5, "k"),
     ("--bytes-per-element", positive, 4.0, "B")],
    _muon)
