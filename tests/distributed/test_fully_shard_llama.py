"""fully_shard (FSDP2) per decoder layer plus the root trains a Llama as one process does.

Every rank takes its rows of the same global batch (accumulated over micro-batches,
the first ones with gradient sync off); one process runs the same micro-batches in turn. Float64
AdamW steps; the parameters, gathered from their Shard(0) pieces, equal one
process's to 1e-12. Drawn: the world, the GQA ratio, a sliding window, packed
documents, tied embeddings, micro-batches, reshard_after_forward, activation
checkpointing, and Mixtral-style MoE layers (with DeepSeek's shared experts and the
balancing loss).
"""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per drawn size, kept for the module

LENGTH, STEPS, TOL = 8, 2, 1e-12


def _model(case):
    from minidist.nn import Llama, LlamaConfig
    moe = dict(num_local_experts=3, num_experts_per_tok=2, moe_intermediate_size=6,
               n_shared_experts=case["shared"], router_aux_loss_coef=0.01,
               moe_balance="micro_batch") if case["moe"] else {}
    return Llama(LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=20,
                             num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=case["kv"], sliding_window=case["window"],
                             tie_word_embeddings=case["tie"], max_position_embeddings=LENGTH,
                             dtype="float64", seed=case["seed"], checkpoint=case["ckpt"],
                             **moe))


def _data(case, batch):
    rng = np.random.default_rng(case["seed"])
    idx = rng.integers(0, 13, (STEPS, batch, LENGTH))
    docs = np.searchsorted(np.array(sorted(case["cuts"])), np.arange(LENGTH), side="right")
    return idx, np.roll(idx, -1, axis=2), np.broadcast_to(docs, (batch, LENGTH)).copy()


def train(case, world, sharded):
    """Parameters after STEPS AdamW steps: this rank's rows under fully_shard (returned
    whole, from the Shard(0) pieces), or one process running every rank's micro-batches
    in turn (the MoE layers balance each micro-batch, ``moe_balance="micro_batch"``, so
    the forwards count no other rank's tokens; for a dense Llama this is the loss of the
    whole batch; global-batch balancing: tests/distributed/test_shared_tokens.py)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.optim import AdamW
    model = _model(case)
    n = dist.get_world_size() if sharded else world
    ranks = [dist.get_rank()] if sharded else range(world)
    if sharded:
        for layer in model.model.layers:
            fully_shard(layer, reshard_after_forward=case["reshard"])
        fully_shard(model)
    opt = AdamW(model.parameters(), lr=0.01)
    idx, tgt, docs = _data(case, 2 * n)              # two rows per rank
    per = 2
    counts = []
    for s in range(STEPS):
        comm = CommDebugMode()
        with comm:
            run_step(model, case, ranks, per, idx[s], tgt[s], docs, sharded)
        counts.append(comm.get_phase_counts())
        opt.step()
        opt.zero_grad()
    if sharded:
        return counts, {k: backend.to_host(d.full_tensor().data).copy()
                        for k, d in sharded_state_dict(model).items()
                        if hasattr(d, "full_tensor")}   # the parameters, not the buffers
    return counts, {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}


def run_step(model, case, ranks, per, idx, tgt, docs, sharded):
    """Forward and backward of every micro-batch of ``ranks``' rows of one step."""
    from minidist import backend
    for rank in ranks:
        chunks = np.array_split(np.arange(rank * per, (rank + 1) * per), case["micro"])
        for i, chunk in enumerate(chunks):
            if sharded:        # sync only on the last micro-batch (one reduce-scatter)
                model.set_requires_gradient_sync(i == len(chunks) - 1)
            x, y, d = (backend.from_host(a[chunk]) for a in (idx, tgt, docs))
            _, loss = model(x, y, document_ids=d)
            # the mean over this rank's rows; one process: also over the ranks
            (loss * (len(chunk) / per / len(ranks))).backward()

@settings(max_examples=3, deadline=None)
@example(n=2, kv=2, window=None, cuts=[3], tie=False, micro=2, reshard=True, moe=True,
         shared=0, ckpt=True, seed=1)      # checkpointed MoE layers: always one such case
@given(n=st.sampled_from([2, 3]), kv=st.sampled_from([1, 2, 4]),
       window=st.sampled_from([None, 3]),
       cuts=st.lists(st.integers(1, LENGTH - 1), max_size=2, unique=True), tie=st.booleans(),
       micro=st.sampled_from([1, 2]), reshard=st.booleans(), moe=st.booleans(),
       shared=st.sampled_from([0, 1]), ckpt=st.booleans(), seed=st.integers(0, 100))
def test_fully_shard_trains_a_llama_as_one_process(worlds, n, kv, window, cuts, tie, micro,
                                                   reshard, moe, shared, ckpt, seed):
    case = dict(kv=kv, window=window, cuts=cuts, tie=tie, micro=micro, reshard=reshard,
                moe=moe, shared=shared, ckpt=ckpt, seed=seed)
    _, ref = train(case, n, False)
    layers, units, micro = 2, 3, case["micro"]     # a unit per layer, and the root
    kept = not reshard or moe                       # an MoE layer keeps its gathered weights
    # activation checkpointing runs each layer's forward again in backward, which gathers
    # its weights once more and keeps them for the layer's backward (no third gather)
    forward = micro * (units + layers * ckpt)
    for rank, (counts, params) in enumerate(worlds(n).run(train, case, n, True)):
        for c in counts:    # all-gathers per micro-batch, one reduce-scatter per unit
            assert c["forward"] == {"all_gather_into_tensor": forward}, c
            assert c["backward"] == {"reduce_scatter_tensor": units,
                                     **({} if kept or ckpt else {"all_gather_into_tensor":
                                                                 micro * layers})}, c
        assert params.keys() == {k for k in ref if not (tie and k == "lm_head.weight")}
        for name, got in params.items():
            diff = np.abs(got - ref[name]).max()
            assert diff <= TOL, f"rank {rank} {name}: {diff:.2e}; {case}"
