"""What every composition trains, and how: the case record, the three models, the
features, and the training loop that one process and every strategy share.

A case is (strategy, model, feature, seed). The models are small float64 ones:

    gpt        GPT, 2 blocks, 2 heads, C = 8 (with ``balance_*`` or expert parallelism:
               every MLP an MoE of 4 experts, top-2)
    llama      Llama, 2 layers, 2 heads, 2 key/value heads, C = 8
    moe_llama  Mixtral-style Llama: every MLP 4 SwiGLU experts, top-2

and the features, one per case:

    clip           clip by the whole model's gradient norm (MAX_NORM: every step clips)
    scaler         GradScaler (2^10; powers of two, so exact in float64)
    checkpoint     activation checkpointing (config.checkpoint)
    lamb, lars     the optimizer instead of AdamW (trust ratios per tensor)
    fp8            per-tensor current scaling (the same recipe in one process), every
                   amax combined over the ranks that split the batch or the tensor
    balance_loss   the MoE balancing loss (global-batch balancing, the default)
    balance_bias   DeepSeek-V3's loss-free bias (update_moe_bias after each step)

Each run trains STEPS steps on the same global batches (B rows of T tokens each), one
process on the whole batch being the oracle.
"""
from contextlib import nullcontext
from typing import Any, Callable, NamedTuple

import numpy as np

B, T, VOCAB, STEPS = 4, 8, 12, 2
MICRO = 2                  # pipeline micro-batches per step
MAX_NORM = 0.05            # below every step's norm here: each step is clipped
SCALE = 2.0 ** 10          # GradScaler's initial scale
LR = 0.02

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fully_shard", "tp", "pipeline", "context",
              "expert")
MODELS = ("gpt", "llama", "moe_llama")
FEATURES = ("clip", "scaler", "checkpoint", "lamb", "lars", "fp8", "balance_loss",
            "balance_bias")


class Case(NamedTuple):
    strategy: str       # one of STRATEGIES
    model: str          # one of MODELS
    feature: str        # one of FEATURES
    seed: int = 0       # weights and batches


class Run(NamedTuple):
    """How one strategy trains one model on one rank (built by strategies.py)."""
    backward: Callable  # (idx, tgt, scale, autocast) -> None: forward (inside autocast())
                        # and backward of scale(loss) over this rank's share of the batch
    step: Callable      # (scaler) -> None: clip if the case clips, step, zero the gradients
    parameters: Callable  # () -> {name: whole parameter as a host array} this rank holds
    group: Any = "alone"  # the group whose ranks split the batch or the tensors: FP8's
                          # amaxes and GradScaler's flag combine over it (None: the world;
                          # "alone": nothing to combine)


def applies(case: Case) -> bool:
    """A dense Llama has no router to balance: the MoE Llama covers balancing."""
    return not (case.model == "llama" and case.feature.startswith("balance"))


def is_moe(case: Case) -> bool:
    """The MoE Llama; the GPT with MoE blocks where balanced or expert-parallel."""
    return case.model == "moe_llama" or (case.model == "gpt" and (
        case.feature.startswith("balance") or case.strategy == "expert"))


def build_model(case: Case):
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    coef = 0.02 if case.feature == "balance_loss" else 0.0
    rate = 0.01 if case.feature == "balance_bias" else 0.0
    ckpt = case.feature == "checkpoint"
    if case.model == "gpt":
        # FP8: a row-parallel layer adds its bias after the sum, outside the cast one
        # process applies to it (docs/precision.md), so FP8 cases run without biases
        moe = dict(moe_every=1, n_expert=4, moe_top_k=2) if is_moe(case) else {}
        return GPT(GPTConfig(block_size=T, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=8,
                             bias=case.feature != "fp8", checkpoint=ckpt, moe_aux_coef=coef,
                             moe_bias_rate=rate, dtype="float64", seed=case.seed, **moe))
    moe = dict(num_local_experts=4, num_experts_per_tok=2) if is_moe(case) else {}
    return Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=12,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                             max_position_embeddings=T, checkpoint=ckpt,
                             router_aux_loss_coef=coef, moe_bias_rate=rate, dtype="float64",
                             seed=case.seed, **moe))


def make_optimizer(case: Case, params) -> Any:
    from minidist.optim import LAMB, LARS, AdamW
    if case.feature == "lamb":
        return LAMB(params, lr=1e-2, weight_decay=0.01)
    if case.feature == "lars":
        return LARS(params, lr=1.0, weight_decay=1e-3, trust_coefficient=0.01)
    return AdamW(params, lr=LR)


def optimizer_class(case: Case) -> tuple[type, dict]:
    """The optimizer as a class and its arguments (what ZeRO takes)."""
    from minidist.optim import LAMB, LARS, AdamW
    return {"lamb": (LAMB, dict(lr=1e-2, weight_decay=0.01)),
            "lars": (LARS, dict(lr=1.0, weight_decay=1e-3, trust_coefficient=0.01))}.get(
        case.feature, (AdamW, dict(lr=LR)))


def plain_step(case: Case, opt: Any, clip: Callable[[float], Any]) -> Callable:
    """A step for a strategy whose optimizer is an ordinary one: unscale, clip with
    ``clip`` (the strategy's whole-model clip) if the case clips, step, zero."""
    def step(scaler):
        if scaler is not None:
            scaler.unscale_(opt)
        if case.feature == "clip":
            clip(MAX_NORM)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
    return step


def host_parameters(named) -> dict:
    from minidist import backend
    return {n: backend.to_host(q.data).copy() for n, q in named}


def one_process(case: Case, model) -> Run:
    """The oracle: the whole batch in one process; for the pipeline, its MICRO
    micro-batches one after the other, accumulated (what FP8 scales per micro-batch)."""
    from minidist import backend
    from minidist.optim import clip_grad_norm_
    opt = make_optimizer(case, model.parameters())
    micro = MICRO if case.strategy == "pipeline" else 1

    def backward(idx, tgt, scale, autocast):
        for rows in np.split(np.arange(B), micro):
            with autocast():
                _, loss = model(backend.from_host(idx[rows]), backend.from_host(tgt[rows]))
            scale(loss / micro).backward()

    return Run(backward, plain_step(case, opt, lambda m: clip_grad_norm_(model.parameters(), m)),
               lambda: whole_model(model))


def train(case: Case, strategy: Callable | None = None) -> dict:
    """Parameters (and MoE biases) after STEPS steps: one process (``strategy`` None),
    or this rank's share under ``strategy(case, model) -> Run``."""
    from minidist.precision import CurrentScaling, GradScaler, fp8_autocast
    model = build_model(case)
    run = one_process(case, model) if strategy is None else strategy(case, model)
    from minidist.parallel import amax_reduce, found_inf_reduce
    scaler = None
    if case.feature == "scaler":
        reduce = None if run.group == "alone" else found_inf_reduce(run.group)
        scaler = GradScaler(init_scale=SCALE, found_inf_reduce=reduce)
    autocast = nullcontext
    if case.feature == "fp8":
        extra = {} if run.group == "alone" else {"amax_reduce": amax_reduce(run.group)}
        recipe = CurrentScaling(**extra)

        def autocast():
            return fp8_autocast(recipe)
    rng = np.random.default_rng(case.seed)
    for _ in range(STEPS):
        idx = rng.integers(0, VOCAB, (B, T))
        tgt = np.roll(idx, -1, axis=1)
        run.backward(idx, tgt, (lambda x: x) if scaler is None else scaler.scale, autocast)
        run.step(scaler)
        model.update_moe_bias()
    return run.parameters()


def whole_model(model, named=None) -> dict:
    """name -> parameter (``named``: the model's own by default), bias<i> -> MoE layer
    i's expert bias, as host arrays."""
    out = host_parameters(model.named_parameters() if named is None else named)
    out.update(moe_biases(model))
    return out


def moe_biases(model, holds: Callable = lambda moe: True) -> dict:
    """bias<i> -> MoE layer i's expert bias, for the layers ``holds``."""
    from minidist import backend
    return {f"bias{i}": backend.to_host(moe.expert_bias).copy()
            for i, moe in enumerate(model.moe_layers()) if holds(moe)}
