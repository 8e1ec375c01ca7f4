"""A replica killed mid-step costs the step, not the run: the survivors equal one process
taking the mean gradient over the quorum's replicas and dropping the failed step; a spare
heals bit-identical to its source; two failures, a failure while healing, and the loss of
all replicas but one are handled; bad input is refused with a clear message."""
import multiprocessing
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import RankFailedError, World
from minidist.comm.launch import RankLost

from parallel.fault_tolerance.ft_cases import case_of, piece_of, simulate, train_on_rank

PHASES = ["forward", "backward", "allreduce"]


def run_world(case):
    """Every rank's result; then no rank's process and no shared-memory segment is left."""
    n, segment = case["replicas"] * case["parts"], None
    try:
        with World(n, fault_tolerant=True, timeout=20.0, run_timeout=90.0) as world:
            segment = world.segment_name
            return world.run(train_on_rank, case)
    finally:
        assert multiprocessing.active_children() == []
        assert segment is None or not os.path.exists(f"/dev/shm/{segment}")


def assert_survivors_follow_the_oracle(case, got):
    """Every rank that kept training equals the oracle after every iteration, and every
    failed step failed because a member died (PeerDiedError), not by a timeout."""
    want = simulate(case)
    survivors = [r for r in got if not isinstance(r, RankLost) and not r["lost"]]
    assert survivors
    for result in survivors:
        for step, snap in result["history"].items():
            for name in want[step]:
                whole = want[step][name]
                expected = whole if result["piece"] is None else piece_of(whole, *result["piece"])
                np.testing.assert_allclose(snap[name], expected, rtol=0, atol=1e-12,
                                           err_msg=f"{name} after step {step}")
        assert set(result["failed"].values()) <= {"PeerDiedError"}
    return survivors


@settings(max_examples=3, deadline=None)
@given(data=st.data(), replicas=st.sampled_from([3, 4]), phase=st.sampled_from(PHASES),
       seed=st.integers(0, 2**16))
def test_survivors_equal_one_process_over_the_quorum_dropping_the_failed_step(
        data, replicas, phase, seed):
    step = data.draw(st.integers(0, 3), label="kill step")
    victim = data.draw(st.integers(0, replicas - 1), label="victim")
    case = case_of(replicas=replicas, seed=seed, kills=[(victim, 0, step, phase)])
    got = run_world(case)
    assert got[victim] == RankLost(victim, -9)
    survivors = assert_survivors_follow_the_oracle(case, got)
    assert all(r["failed"] == {step: "PeerDiedError"} for r in survivors)


@settings(max_examples=3, deadline=None)
@given(data=st.data(), pair=st.sampled_from(["ddp", "fsdp"]), replicas=st.sampled_from([3, 4]),
       phase=st.sampled_from(PHASES), step=st.integers(0, 3), part=st.integers(0, 1))
def test_replicas_of_a_pair_lose_the_whole_replica_and_go_on(data, pair, replicas, phase, step,
                                                             part):
    # a DDP pair (whole models, gradients all-reduced in the pair) or an FSDP pair
    # (fully_shard over the pair, the Manager over dp_replicate as HSDP's dim 0)
    victim = data.draw(st.integers(0, replicas - 1), label="victim")
    case = case_of(replicas=replicas, parts=2, pair=pair, kills=[(victim, part, step, phase)])
    got = run_world(case)
    assert got[2 * victim + part] == RankLost(2 * victim + part, -9)
    partner = got[2 * victim + 1 - part]
    assert partner["lost"].startswith(f"replica {victim} lost rank(s) [{2 * victim + part}]")
    assert "a replica of 2 ranks is not replaced by minidist run" in partner["lost"]
    survivors = assert_survivors_follow_the_oracle(case, got)
    assert len(survivors) == 2 * (replicas - 1)
    assert all(r["failed"] == {step: "PeerDiedError"} for r in survivors)


def test_a_spare_heals_bit_identical_to_its_source_then_trains_in_the_quorum():
    case = case_of(replicas=3, num_replicas=2, steps=5, kills=[(1, 0, 2, "backward")])
    got = run_world(case)
    spare, source = got[2], got[0]
    join, state = spare["healed"]
    assert join == 3                            # the quorum after the failed step 2
    assert set(state) == set(source["history"][join - 1])
    for name, value in state.items():           # parameters, AdamW's moments and step, RNG
        assert np.array_equal(value, source["history"][join - 1][name]), name
    assert sorted(spare["history"]) == [3, 4]
    assert_survivors_follow_the_oracle(case, got)
    left, healed = str(source["changes"][-1]).split("\n")
    assert left == "step 2: replica 1 left (rank 1: SIGKILL), quorum 2 of 3"
    assert healed.startswith("step 2: replica 2 healed from replica 0 in")


@pytest.mark.parametrize("pair", ["ddp", "fsdp"])
def test_a_spare_pair_heals_rank_by_rank_bit_identical_to_its_source(pair):
    # replicas of two ranks, the third a spare pair; a rank of replica 1 dies in backward
    # at step 2: each rank of the spare receives its state from the rank at its place in
    # replica 0 (the same pieces under fsdp), then trains in the quorum
    case = case_of(replicas=3, parts=2, pair=pair, num_replicas=2, steps=5,
                   kills=[(1, 1, 2, "backward")])
    got = run_world(case)
    for spare, source in ((got[4], got[0]), (got[5], got[1])):
        join, state = spare["healed"]
        assert join == 3
        assert set(state) == set(source["history"][join - 1])
        for name, value in state.items():       # parameters, AdamW's moments and step, RNG
            assert np.array_equal(value, source["history"][join - 1][name]), name
        assert sorted(spare["history"]) == [3, 4]
    assert got[2]["lost"]
    assert_survivors_follow_the_oracle(case, got)


def test_two_failures_in_a_row_the_second_while_healing_cost_one_step_each():
    # replica 1 dies at step 1; spare 2 steps in at step 2 and dies once it has the state;
    # spare 3 steps in at step 3
    case = case_of(replicas=4, num_replicas=2, steps=5,
                   kills=[(1, 0, 1, "allreduce"), (2, 0, 2, "heal")])
    got = run_world(case)
    assert [type(r) for r in got[1:3]] == [RankLost, RankLost]
    first, spare = assert_survivors_follow_the_oracle(case, got)
    assert first["failed"] == {1: "PeerDiedError", 2: "PeerDiedError"}
    assert spare["healed"][0] == 3 and spare["failed"] == {}


def test_losing_every_replica_but_one_falls_back_to_a_world_restart():
    case = case_of(replicas=3, min_replica_size=2, kills=[(1, 0, 1, "forward"),
                                                          (2, 0, 2, "backward")])
    with pytest.raises(RankFailedError) as failure:
        run_world(case)
    assert failure.value.exc_type == "QuorumLostError"
    assert "falling back to a restart of the whole world" in str(failure.value)
