"""DiLoCo with a shard_group: each rank of a DDP replica reduces its slice of the outer
gradient across the replicas. Algorithm 1 still, the replicas bitwise equal after a sync,
and 1/L of the bytes on the slow link."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World

from parallel.diloco.diloco_cases import LAYERS, case_of, simulate
from parallel.diloco.test_diloco import assert_close, train_replica_of_ddp
from parallel.diloco.test_streaming import merges


@pytest.fixture(scope="module")
def islands():
    """Four ranks as two nodes of two (the slow link between them), each node one DDP
    replica; no same-call check, so the links carry the collectives' bytes only."""
    w = World(4, node_size=2, link_gbps=100.0, inter_node_gbps=50.0, check=False,
              timeout=20.0, run_timeout=120.0)
    yield w
    w.close()


@st.composite
def sliced_cases(draw):
    F = draw(st.sampled_from([1, 2]))
    H = F * draw(st.integers(1, 2))
    return case_of(world=2, F=F, H=H, tau=draw(st.integers(0, min(1, H // F - 1))),
                   alpha=draw(st.sampled_from([0.0, 0.5])), batch=4, steps=2 * H + 1,
                   fmt=draw(st.sampled_from([None, "e4m3fn", "e2m1fn"])),
                   seed=draw(st.integers(0, 2**16)))


@settings(max_examples=4, deadline=None)
@given(case=sliced_cases())
def test_sliced_outer_gradients_match_algorithm_1_and_leave_replicas_bitwise_equal(islands,
                                                                                     case):
    """Ranks 0, 1 are replica 0 and ranks 2, 3 replica 1: every rank equals its replica
    in the one-process simulation, and a merged fragment (alpha = 0) has the same bits
    on all four."""
    got = islands.run(train_replica_of_ddp, case, True)
    want = simulate(case)
    for step in range(case["steps"]):
        for rank in range(4):
            assert_close(got[rank][step], want[step][rank // 2])
    if case["alpha"] == 0.0:
        cuts = np.array_split(np.arange(len(LAYERS)), case["F"])
        for t, f in merges(case).items():
            for n in got[0][t - 1]:
                if n.split(".")[0] in [LAYERS[i] for i in cuts[f]]:
                    assert all(np.array_equal(got[r][t - 1][n], got[0][t - 1][n])
                               for r in range(4)), (t, n)


@pytest.mark.parametrize("fmt, bits", [(None, 64), ("e4m3fn", 8)])
def test_sliced_outer_gradients_put_1_over_l_of_the_bytes_on_the_slow_link(islands, fmt, bits):
    """Two syncs of the float64 net (n = 46 values, 6 tensors) between 2 replicas of
    L = 2 ranks: unsliced, each rank all-reduces all n values (n * 8 bytes a sync); with
    the shard_group each sends its n / L (quantised: its n / L codes and the 6 scale
    exponents). DDP inside a replica stays on the fast link."""
    case = case_of(world=2, seed=4, H=2, steps=4, batch=4, fmt=fmt)
    whole = sum(b for _, b in islands.run(train_replica_of_ddp, case, False, True))
    sliced = sum(b for _, b in islands.run(train_replica_of_ddp, case, True, True))
    n, tensors, syncs, ranks = 46, 6, 2, 4
    if fmt is None:
        assert whole == syncs * ranks * n * 8
        assert sliced * 2 == whole
    else:
        assert whole == syncs * ranks * (n * bits // 8 + 4 * tensors)
        assert sliced == syncs * ranks * (n // 2 * bits // 8 + 4 * tensors)


def build_with_shard_group(choice):
    """DiLoCo over 'replica' given a wrong shard_group: the error's text on this rank."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.comm.group import world_group
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.optim import SGD, AdamW
    from minidist.parallel.diloco import DiLoCo
    from parallel.diloco.diloco_cases import make_model, shard_replica
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("replica", "dp"))
    model = make_model(case_of())
    if choice == "fsdp":                 # the replica's ranks hold pieces, not copies
        shard_replica(model, mesh["dp"])
        shard_group = mesh["dp"]
    elif choice == "world":              # the other replica's ranks too
        shard_group = world_group()
    else:                                # replica 0 sliced in 2, replica 1's ranks alone
        groups = [dist.new_group(r) for r in ([0, 1], [2], [3])]
        shard_group = groups[0] if dist.get_rank() < 2 else groups[dist.get_rank() - 1]
    try:
        DiLoCo(model, AdamW(model.parameters(), lr=1e-3), SGD(model.parameters(), lr=0.7),
               sync_every=2, group=mesh["replica"], shard_group=shard_group)
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("choice, message", [
    ("world", r"shard_group \[0, 1, 2, 3\] holds ranks of other replicas .* "
              r"shard_group=mesh\['dp'\] beside group=mesh\['replica'\]"),
    ("uneven", r"at different places of their shard_groups \(\(place, size\) per replica: "
               r"\[\(\d, 2\), \(0, 1\)\]\): give every replica a shard_group of the same size"),
    ("fsdp", r"DiLoCo's shard_group over ranks \[\d, \d\] cannot hold 'fc1.weight'"),
])
def test_a_shard_group_that_is_not_one_replicas_copies_is_refused(islands, choice, message):
    for text in islands.run(build_with_shard_group, choice):
        assert re.search(message, text), text
