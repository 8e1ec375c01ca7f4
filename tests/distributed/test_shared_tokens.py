"""The routers' statistics count every token the strategies split over ranks, as one
process counts the whole batch (distributed/_shared_tokens.py):

- data parallelism (DDP, ZeRO-1, ZeRO-3) with ``global_batch`` balancing (the default)
  trains an MoE GPT and a Mixtral-style Llama to one process's parameters on the
  global batch;
  ``micro_batch`` balancing to one process accumulating each rank's micro-batch;
- context parallelism (ring, Ulysses) with Mixtral's balancing loss trains to one
  process's parameters on the whole sequences, under either balancing;
- DeepSeek-V3's bias balancing moves every replica's bias as one process moves its
  own, under DDP and context parallelism (both balancings).

float64, 3 AdamW steps, within 1e-12."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

B, T, STEPS, VOCAB = 4, 8, 3, 13

worlds = worlds_fixture()


def _model(case):
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    if case["model"] == "gpt":
        return GPT(GPTConfig(block_size=T, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=8,
                             moe_every=1, n_expert=4, moe_top_k=2, moe_aux_coef=case["coef"],
                             moe_bias_rate=case["rate"], moe_balance=case["balance"],
                             dtype="float64", seed=case["seed"]))
    return Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=12,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                             max_position_embeddings=T, num_local_experts=4,
                             num_experts_per_tok=2, router_aux_loss_coef=case["coef"],
                             moe_bias_rate=case["rate"], moe_balance=case["balance"],
                             dtype="float64", seed=case["seed"]))


def train(case, strategy, micro_batches=1):
    """Parameters and biases after STEPS steps: one process (``strategy`` None, the whole
    batch cut into ``micro_batches`` accumulated ones), or this rank's run of "ddp",
    "zero1", "zero3", "ring" or "ulysses"."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.optim import AdamW
    from minidist.parallel.context.llama import (average_gradients, context_parallel,
                                                 sequence_positions, shard_tokens)
    from minidist.parallel import Zero1, Zero3
    from minidist.parallel.data import DistributedDataParallel
    model = _model(case)
    rng = np.random.default_rng(case["seed"])
    run = model
    opt = AdamW(model.parameters(), lr=0.02)
    if strategy == "ddp":
        run = DistributedDataParallel(model)
    elif strategy in ("zero1", "zero3"):
        run = opt = (Zero1 if strategy == "zero1" else Zero3)(model, AdamW, lr=0.02)
    elif strategy is not None:
        context_parallel(model, kind=strategy)
    for _ in range(STEPS):
        idx = rng.integers(0, VOCAB, (B, T))
        x, y = backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1))
        if strategy in ("ddp", "zero1", "zero3"):
            rank, n = dist.get_rank(), dist.get_world_size()
            part = slice(rank * B // n, (rank + 1) * B // n)
            run(x[part], y[part])[1].backward()
        elif strategy is not None:
            rank, n = dist.get_rank(), dist.get_world_size()
            pos = sequence_positions(T, rank, n, strategy)
            x, y = (shard_tokens(a, rank, n, strategy) for a in (x, y))
            model(x, y, position_ids=pos)[1].backward()
            average_gradients(model)
        else:
            for m in range(micro_batches):
                part = slice(m * B // micro_batches, (m + 1) * B // micro_batches)
                (model(x[part], y[part])[1] / micro_batches).backward()
        opt.step()
        opt.zero_grad()
        model.update_moe_bias()
    if strategy == "zero3":          # its parameters live in shards between steps
        params = {k: backend.to_host(a).copy() for k, a in run.full_state_dict().items()}
    else:
        params = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    params.update({f"bias{i}": backend.to_host(m.expert_bias).copy()
                   for i, m in enumerate(model.moe_layers())})
    return params


def _assert_close(want, got, case):
    for rank, params in enumerate(got):
        for name, w in want.items():
            diff = np.abs(params[name] - w).max()
            assert diff <= 1e-12, f"rank {rank} {name}: {diff:.2e}; {case}"


CASES = dict(model=st.sampled_from(["gpt", "llama"]), coef=st.sampled_from([0.01, 0.1]),
             rate=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 100))


@settings(max_examples=4, deadline=None)
@given(strategy=st.sampled_from(["ddp", "zero1", "zero3"]), **CASES)
def test_data_parallel_global_batch_balancing_trains_as_one_process(worlds, strategy, model,
                                                                   coef, rate, seed):
    case = dict(model=model, coef=coef, rate=rate, seed=seed, balance="global_batch")
    _assert_close(train(case, None), worlds(2).run(train, case, strategy), case)


@settings(max_examples=3, deadline=None)
@given(**CASES)
def test_ddp_micro_batch_balancing_trains_as_accumulated_micro_batches(worlds, model, coef,
                                                                       rate, seed):
    """Each rank's balancing loss counts its own micro-batch: one process accumulating
    the same micro-batches; the bias still moves by the whole batch's counts."""
    case = dict(model=model, coef=coef, rate=rate, seed=seed, balance="micro_batch")
    _assert_close(train(case, None, micro_batches=2), worlds(2).run(train, case, "ddp"), case)


@settings(max_examples=4, deadline=None)
@given(kind=st.sampled_from(["ring", "ulysses"]), balance=st.sampled_from(
    ["global_batch", "micro_batch"]), coef=st.sampled_from([0.02, 0.1]),
       rate=st.sampled_from([0.0, 0.01]), seed=st.integers(0, 100))
def test_context_parallel_moe_llama_trains_as_one_process(worlds, kind, balance, coef, rate,
                                                         seed):
    """The ranks hold parts of the same sequences: their counts are summed under either
    balancing, so the loss and the bias are one process's."""
    case = dict(model="llama", coef=coef, rate=rate, seed=seed, balance=balance)
    _assert_close(train(case, None), worlds(2).run(train, case, kind), case)


@settings(max_examples=4, deadline=None)
@given(strategy=st.sampled_from(["ddp", "ring", "ulysses"]), balance=st.sampled_from(
    ["global_batch", "micro_batch"]), rate=st.sampled_from([0.01, 0.1]), seed=st.integers(0, 100))
def test_bias_balancing_moves_every_replica_as_one_process(worlds, strategy, balance, rate, seed):
    """No balancing loss: only DeepSeek-V3's bias, nudged by the whole batch's loads."""
    model = "gpt" if strategy == "ddp" else "llama"
    case = dict(model=model, coef=0.0, rate=rate, seed=seed, balance=balance)
    _assert_close(train(case, None), worlds(2).run(train, case, strategy), case)
