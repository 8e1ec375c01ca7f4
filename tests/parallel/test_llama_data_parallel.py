"""DDP and ZeRO-1/2/3 take a Llama as they take a GPT, and train it to the parameters of
one process on the whole batch (float64, within 1e-12: only the order of the sums of
gradients differs). Drawn: the world (2 or 3 ranks, two rows each), the GQA ratio, a
sliding window, packed-document boundaries, tied embeddings, micro-batches accumulated
before each step."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per drawn size, kept for the module

ROWS, LENGTH, STEPS = 2, 8, 2           # rows per rank


def _model(case):
    from minidist.nn import Llama, LlamaConfig
    return Llama(LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=20,
                             num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=case["kv"], sliding_window=case["window"],
                             tie_word_embeddings=case["tie"], max_position_embeddings=LENGTH,
                             attention=case["attention"], dtype="float64", seed=case["seed"]))


def _data(case):
    rng = np.random.default_rng(case["seed"])
    batch = ROWS * case["world"]
    idx = rng.integers(0, 13, (STEPS, batch, LENGTH))
    docs = np.searchsorted(np.array(sorted(case["cuts"])), np.arange(LENGTH), side="right")
    return idx, np.roll(idx, -1, axis=2), np.broadcast_to(docs, (batch, LENGTH)).copy()


def train(case, strategy):
    """Parameters after STEPS AdamW steps, one process ('single') or this rank's."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.optim import AdamW
    from minidist.parallel import DistributedDataParallel, Zero1, Zero2, Zero3
    model = _model(case)
    rank, n = (0, 1) if strategy == "single" else (dist.get_rank(), dist.get_world_size())
    wrapped, opt = model, None
    if strategy == "ddp":
        wrapped = DistributedDataParallel(model)
    elif strategy in ("zero1", "zero2", "zero3"):
        cls = {"zero1": Zero1, "zero2": Zero2, "zero3": Zero3}[strategy]
        wrapped = cls(model, AdamW, lr=0.01)
    if strategy in ("single", "ddp"):
        opt = AdamW(model.parameters(), lr=0.01)
    idx, tgt, docs = _data(case)
    per, micro = ROWS * case["world"] // n, case["micro"]
    for s in range(STEPS):
        rows = np.arange(rank * per, (rank + 1) * per)
        for chunk in np.array_split(rows, micro):
            x, y, d = (backend.from_host(a[chunk]) for a in (idx[s], tgt[s], docs))
            _, loss = wrapped(x, y, document_ids=d)
            (loss * (len(chunk) / per)).backward()  # the mean over this rank's rows
        if opt is None:
            wrapped.step()
            wrapped.zero_grad()
        else:
            opt.step()
            opt.zero_grad()
    if strategy == "zero3":
        return {k: backend.to_host(v).copy() for k, v in wrapped.full_state_dict().items()}
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}


@settings(max_examples=2, deadline=None)
@given(n=st.sampled_from([2, 3]), kv=st.sampled_from([1, 2, 4]), window=st.sampled_from([None, 3]),
       cuts=st.lists(st.integers(1, LENGTH - 1), max_size=2, unique=True), tie=st.booleans(),
       micro=st.sampled_from([1, 2]), attention=st.sampled_from(["naive", "flash"]),
       seed=st.integers(0, 100))
def test_ddp_and_zero_train_a_llama_as_one_process(worlds, n, kv, window, cuts, tie, micro,
                                                   attention, seed):
    case = dict(world=n, kv=kv, window=window, cuts=cuts, tie=tie, micro=micro,
                attention=attention, seed=seed)
    ref = train(case, "single")
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        for rank, params in enumerate(worlds(n).run(train, case, strategy)):
            for name, want in ref.items():
                if name not in params:      # ZeRO-3 names a tied matrix once
                    continue
                diff = np.abs(params[name] - want).max()
                assert diff <= 1e-12, f"{strategy} rank {rank} {name}: {diff:.2e}; {case}"
