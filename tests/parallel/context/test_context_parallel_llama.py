"""A Llama trained context-parallel (ring attention with the zigzag layout, or Ulysses),
each rank holding a part of every sequence with RoPE at its tokens' global positions,
reaches the parameters of one process on whole sequences (float64, 1e-12). The group
(2 or 4 ranks) and GQA drawn: ring attention sends only the key/value heads; Ulysses
refuses kv heads its group does not divide. Sliding windows and packed documents
(positions restarting per document) drawn under both, in worlds of 2 and 4."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import RankFailedError, World
from tests.distributed.worlds import worlds_fixture

B, T, STEPS = 2, 8, 2

worlds = worlds_fixture()      # a world per size, started when first drawn, kept for the module


@pytest.fixture(scope="module")
def world(worlds):
    return worlds(2)


@pytest.fixture(scope="module")
def world4(worlds):
    return worlds(4)


def _config(case):
    from minidist.nn import LlamaConfig
    return LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=case["kv"],
                       tie_word_embeddings=case["tie"], max_position_embeddings=T,
                       dtype="float64", seed=case["seed"], rope_theta=case["theta"],
                       sliding_window=case.get("window"))


def train(case, parallel):
    """Parameters and losses after STEPS AdamW steps: one process, or this rank's run."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn import Llama
    from minidist.nn.llama import positions_in_documents
    from minidist.optim import AdamW
    from minidist.parallel.context.llama import (average_gradients, context_parallel,
                                                 sequence_positions, shard_tokens)
    model = Llama(_config(case))
    kind, layout = case["kind"], "zigzag"
    if parallel:
        rank, n = dist.get_rank(), dist.get_world_size()
        context_parallel(model, kind=kind, layout=layout, impl=case["impl"])
    opt = AdamW(model.parameters(), lr=0.01)
    rng = np.random.default_rng(case["seed"])
    cuts = np.array(sorted(case.get("cuts", [])), dtype=np.int64)
    docs = backend.from_host(np.searchsorted(cuts, np.arange(T), side="right")[None])
    docs = docs if case.get("cuts") else None
    losses = []
    for _ in range(STEPS):
        idx = rng.integers(0, 13, (B, T))
        tgt = np.roll(idx, -1, axis=1)
        x, y = backend.from_host(idx), backend.from_host(tgt)
        if parallel:
            pos = sequence_positions(T, rank, n, kind, layout)
            if docs is not None:        # positions restart per document: my shard of them
                pos = shard_tokens(positions_in_documents(docs), rank, n, kind, layout)
            x, y = (shard_tokens(a, rank, n, kind, layout) for a in (x, y))
            _, loss = model(x, y, position_ids=pos, document_ids=docs)
            loss.backward()
            average_gradients(model)
            loss = float(backend.to_host(loss.data))
            total = backend.from_host(np.array([loss]))
            dist.all_reduce(total)
            losses.append(float(backend.to_host(total)[0]) / n)
        else:
            _, loss = model(x, y, document_ids=docs)
            loss.backward()
            losses.append(float(backend.to_host(loss.data)))
        opt.step()
        opt.zero_grad()
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}, losses


@settings(max_examples=2, deadline=None)
@given(cp=st.sampled_from([2, 4]), kind=st.sampled_from(["ring", "ulysses"]),
       kv=st.sampled_from([1, 2, 4]), impl=st.sampled_from(["naive", "flash"]),
       tie=st.booleans(), theta=st.sampled_from([10000.0, 500000.0]), seed=st.integers(0, 100))
def test_context_parallel_llama_trains_as_one_process(worlds, cp, kind, kv, impl, tie, theta,
                                                      seed):
    """cp ranks (the zigzag cuts T = 8 into 2 cp pieces); GQA ratio drawn."""
    if kind == "ulysses":
        kv = max(kv, cp)                 # refused: test_ulysses_refuses_kv_heads_...
    case = dict(kind=kind, kv=kv, impl=impl, tie=tie, theta=theta, seed=seed)
    want, want_losses = train(case, False)
    for rank, (params, losses) in enumerate(worlds(cp).run(train, case, True)):
        assert np.allclose(losses, want_losses, rtol=1e-12, atol=0)
        for name, w in want.items():
            diff = np.abs(params[name] - w).max()
            assert diff <= 1e-12, f"{kind} rank {rank} {name}: {diff:.2e}; {case}"


def _ulysses_one_kv_head():
    from minidist.nn import Llama
    from minidist.parallel.context.llama import context_parallel
    context_parallel(Llama(_config(dict(kv=1, tie=False, seed=0, theta=1e4))), kind="ulysses")


def test_ulysses_refuses_kv_heads_the_group_does_not_divide():
    with World(2, timeout=20.0, run_timeout=60.0) as w:   # a failure closes its world
        with pytest.raises(RankFailedError, match="num_key_value_heads=1 is not divisible by 2"):
            w.run(_ulysses_one_kv_head)


def _positions():
    from minidist import backend
    from minidist.parallel.context.llama import sequence_positions
    return [backend.to_host(sequence_positions(8, r, 2, kind)).tolist()
            for r in range(2) for kind in ("ring", "ulysses")]


def test_each_rank_holds_its_global_positions():
    assert _positions() == [[0, 1, 6, 7], [0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]]


def _masked_case(kind, kv, window, cuts, impl, seed):
    case = dict(kind=kind, kv=kv, impl=impl, tie=False, theta=1e4, seed=seed, window=window,
                cuts=cuts)
    if kind == "ulysses" and kv == 1:
        case["kv"] = 2                   # refused: test_ulysses_refuses_kv_heads_...
    return case


def _trains_as_one_process(world, case):
    want, want_losses = train(case, False)
    for rank, (params, losses) in enumerate(world.run(train, case, True)):
        assert np.allclose(losses, want_losses, rtol=1e-12, atol=0)
        for name, w in want.items():
            assert np.abs(params[name] - w).max() <= 1e-12, (rank, name, case)


# windows: 1 (each token alone), shorter than a shard, spanning shards, the whole row
WINDOWS = st.sampled_from([None, 1, 3, 5, T + 2])
CUTS = st.lists(st.integers(1, T - 1), min_size=1, max_size=3, unique=True)  # 1-token docs too


@pytest.mark.parametrize("kind", ["ring", "ulysses"])
@settings(max_examples=3, deadline=None)
@given(kv=st.sampled_from([1, 2, 4]), window=WINDOWS, cuts=CUTS,
       impl=st.sampled_from(["naive", "flash"]), seed=st.integers(0, 100))
def test_packed_documents_and_windows_train_as_one_process(world, kind, kv, window, cuts, impl,
                                                           seed):
    _trains_as_one_process(world, _masked_case(kind, kv, window, cuts, impl, seed))


@settings(max_examples=2, deadline=None)
@given(kv=st.sampled_from([1, 2, 4]), window=WINDOWS, cuts=st.one_of(st.just([]), CUTS),
       seed=st.integers(0, 100))
def test_ring_on_four_ranks_trains_packed_documents_and_windows_as_one_process(
        world4, kv, window, cuts, seed):
    _trains_as_one_process(world4, _masked_case("ring", kv, window, cuts, "naive", seed))


def test_context_parallel_refuses_a_model_without_position_ids():
    """The GPT reads positions 0 .. T-1 from a learned table: each rank's shard would be
    embedded at the start of the sequence. It is refused before anything is changed."""
    from minidist.nn import GPT, GPTConfig
    from minidist.parallel.context.llama import context_parallel
    gpt = GPT(GPTConfig(block_size=8, vocab_size=13, n_layer=1, n_head=2, n_embd=8))
    for kind in ("ring", "ulysses"):
        with pytest.raises(TypeError, match=r"(?s)takes a Llama.*position_ids.*nn\.Llama"):
            context_parallel(gpt, kind=kind)
