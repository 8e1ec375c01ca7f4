"""Strategies composed with models and features train as one process, or refuse.

Every (strategy, model, feature) of recipe.py's table trains a small float64 model for
STEPS steps on one global batch in a 2-rank world and compares every parameter (and
MoE expert bias) it holds with one process on the same batch: within 1e-12, FP8 with
the same recipe included (its amaxes combined over the ranks that split the batch or
the tensor; for the pipeline one process accumulates the same micro-batches, since
each takes its own amax). A combination that is not supported must raise one error
naming the cause and the fix (REFUSALS); any other error, or a wrong parameter, fails.

The PAIRWISE rows hold every strategy with every model and with every feature, and
every model with every feature (a dense Llama has no router: the balancing features
go to the MoE Llama and the MoE GPT); the drawn test adds other seeds and triples.
Strategy wiring: strategies.py, one function per strategy.
"""
import re
from typing import Callable, NamedTuple

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import world_fixture
from tests.parallel.compositions.recipe import (FEATURES, MODELS, STRATEGIES, Case, applies,
                                                is_moe, train)
from tests.parallel.compositions.strategies import Refused, run_case

TOL = 1e-12

world = world_fixture([2])


class Refusal(NamedTuple):
    """A combination that is refused, and what its error must say."""
    applies: Callable[[Case], bool]
    error: str          # the exception's class name
    says: str           # a pattern naming the cause and the fix


REFUSALS = [
    Refusal(lambda c: c.strategy.startswith("zero") and c.feature in ("lamb", "lars"),
            "TypeError", r"elementwise optimizer \(SGD, Adam, AdamW.*LAMB.*fully_shard"),
    Refusal(lambda c: c.strategy == "tp" and is_moe(c),
            "ValueError", r"splits dense MLPs.*expert-parallel group"),
    Refusal(lambda c: c.strategy == "pipeline" and c.feature == "balance_loss",
            "ValueError", r"balancing loss.*would be lost.*moe_bias_rate"),
    Refusal(lambda c: c.strategy == "context" and c.model == "gpt",
            "TypeError", r"context_parallel takes a Llama.*position_ids.*nn\.Llama"),
]


def refusal(case: Case) -> Refusal | None:
    return next((r for r in REFUSALS if r.applies(case)), None)


def pairwise() -> list[Case]:
    """Each strategy with each feature, the models taken in turn (so each strategy meets
    every model and each feature every model); a balancing feature skips the dense Llama."""
    cases = []
    for s, strategy in enumerate(STRATEGIES):
        for f, feature in enumerate(FEATURES):
            turn = (s + f) % len(MODELS)
            case = Case(strategy, MODELS[turn], feature, seed=s + f)
            if not applies(case):
                case = case._replace(model="moe_llama" if s % 2 else "gpt")
            cases.append(case)
    return cases


# what the table found wrong, kept as rows: an expert's trust ratio took the norms of
# every rank's experts (LAMB 7e-5, LARS 5e-4 away), an expert's FP8 site max-combined its
# amax with other experts' (8e-2), context_parallel met a GPT with an AttributeError
FOUND = [Case("expert", "moe_llama", "lamb"), Case("expert", "moe_llama", "lars"),
         Case("expert", "gpt", "lamb"), Case("expert", "moe_llama", "fp8"),
         Case("expert", "gpt", "fp8"), Case("context", "gpt", "clip")]
PAIRWISE = pairwise() + FOUND


def check(world, case: Case) -> None:
    results = world.run(run_case, case)
    wanted = refusal(case)
    if wanted is not None:
        for rank, got in enumerate(results):
            assert isinstance(got, Refused), f"rank {rank} trained a refused case: {case}"
            assert got.error == wanted.error and re.search(wanted.says, got.message, re.S), \
                f"rank {rank}: {got}; {case}"
        return
    for rank, got in enumerate(results):
        assert not isinstance(got, Refused), f"rank {rank} refused {case}: {got}"
    want = train(case)
    held = set()
    for rank, params in enumerate(results):
        for name, value in params.items():
            diff = np.abs(value.reshape(want[name].shape) - want[name]).max()
            assert diff <= TOL, f"rank {rank} {name}: {diff:.2e}; {case}"
        held |= params.keys()
    assert held == want.keys(), (sorted(want.keys() - held), case)


def test_the_pairwise_rows_cover_every_pair():
    pairs = [{(c.strategy, c.model) for c in PAIRWISE}, {(c.strategy, c.feature) for c in PAIRWISE},
             {(c.model, c.feature) for c in PAIRWISE}]
    assert pairs[0] == {(s, m) for s in STRATEGIES for m in MODELS}
    assert pairs[1] == {(s, f) for s in STRATEGIES for f in FEATURES}
    assert pairs[2] == {(m, f) for m in MODELS for f in FEATURES
                        if applies(Case("ddp", m, f))}


@pytest.mark.parametrize("case", PAIRWISE, ids=lambda c: f"{c.strategy}-{c.model}-{c.feature}")
def test_composition_trains_as_one_process_or_refuses(world, case):
    check(world, case)


@settings(max_examples=8, deadline=None)
@given(strategy=st.sampled_from(STRATEGIES), model=st.sampled_from(MODELS),
       feature=st.sampled_from(FEATURES), seed=st.integers(0, 1000))
def test_drawn_composition_trains_as_one_process_or_refuses(world, strategy, model, feature,
                                                            seed):
    case = Case(strategy, model, feature, seed)
    assume(applies(case))
    check(world, case)


@pytest.mark.parametrize("feature", FEATURES)
def test_every_feature_acts_in_one_process(feature):
    """So that a composition's test can fail: a feature that changes the math changes
    one process's parameters (clipping clips, FP8 rounds, ...); the loss scale (a power
    of two) and activation checkpointing leave them bit for bit."""
    model = "moe_llama" if feature.startswith("balance") else "llama"
    plain, on = train(Case("ddp", model, "none", 3)), train(Case("ddp", model, feature, 3))
    diff = max(float(np.abs(on[n] - plain[n]).max()) for n in plain)
    if feature in ("scaler", "checkpoint"):
        assert diff == 0.0, (feature, diff)
    else:
        assert diff > 1e-6, (feature, diff)
