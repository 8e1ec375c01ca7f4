"""DiLoCo equals Algorithm 1 simulated in one process, is DDP at H = 1, and keeps the
replicas bitwise equal right after each synchronisation."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World

from parallel.diloco.diloco_cases import case_of, simulate, sync_steps, train_on_rank


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=120.0)
    yield w
    w.close()


def assert_close(got, want, tol=1e-12):
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=tol, err_msg=name)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), H=st.integers(1, 4), inner=st.sampled_from(["adamw", "sgd"]))
def test_diloco_matches_algorithm_1_after_syncs_and_between(world, seed, H, inner):
    case = case_of(world=world.world_size, seed=seed, H=H, steps=2 * H + 1, inner=inner)
    got = world.run(train_on_rank, case)
    want = simulate(case)
    for step in range(case["steps"]):
        for rank in range(world.world_size):
            assert_close(got[rank][step], want[step][rank])


def test_diloco_over_an_inner_muon_matches_algorithm_1(world):
    """Muon updates a group whole (orthogonalising after every momentum): the outer sync,
    a step post-hook of the inner optimizer, must see its update already applied."""
    case = case_of(world=world.world_size, seed=11, H=2, steps=5, inner="muon")
    got, want = world.run(train_on_rank, case), simulate(case)
    for step in range(case["steps"]):
        for rank in range(world.world_size):
            assert_close(got[rank][step], want[step][rank])


def test_diloco_replicas_are_bitwise_equal_right_after_a_sync(world):
    case = case_of(world=world.world_size, seed=3, H=2, steps=6)
    got = world.run(train_on_rank, case)
    syncs = sync_steps(case)
    assert syncs == [2, 4, 6]
    for step in range(case["steps"]):
        same = all(np.array_equal(got[r][step][n], got[0][step][n])
                   for r in range(world.world_size) for n in got[0][step])
        assert same == (step + 1 in syncs), step   # and different between syncs


def ddp_single_process(case):
    """SGD on one model over every replica's batch at once (what DDP computes)."""
    from minidist.optim import SGD
    from parallel.diloco.diloco_cases import batch, loss_backward, make_model, snapshot
    model = make_model(case)
    opt = SGD(model.parameters(), lr=case["inner_lr"])
    out = []
    for step in range(case["steps"]):
        parts = [batch(case, step, i) for i in range(case["world"])]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        loss_backward(model, x, y)
        opt.step()
        opt.zero_grad()
        out.append(snapshot(model))
    return out


def test_sync_every_1_with_sgd_and_outer_lr_1_is_ddp(world):
    case = case_of(world=world.world_size, seed=5, H=1, steps=4, inner="sgd",
                   outer=dict(lr=1.0))
    got = world.run(train_on_rank, case)
    want = ddp_single_process(case)
    for step in range(case["steps"]):
        for rank in range(world.world_size):
            assert_close(got[rank][step], want[step])


def train_replica_of_ddp(case, sliced=False, count_link=False):
    """World 4 as a (replica=2, dp=2) mesh: DiLoCo over 'replica', each replica DDP
    over 'dp' with half of the replica's batch on each rank; ``sliced``: DiLoCo's
    shard_group is 'dp' (each rank sends half of each outer gradient)."""
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("replica", "dp"))
    replica, part = mesh.get_coordinate()
    return train_on_rank(case, replica_group=mesh["replica"], replica=replica, parts=2,
                         part=part, ddp_group=mesh.get_group("dp"),
                         shard_group=mesh["dp"] if sliced else None, count_link=count_link)


def test_diloco_over_a_mesh_dimension_composes_with_ddp_replicas():
    case = case_of(world=2, seed=7, H=2, steps=5, batch=4)
    with World(4, timeout=20.0, run_timeout=120.0) as w:
        got = w.run(train_replica_of_ddp, case.copy())
    want = simulate(case)
    for step in range(case["steps"]):
        for rank in range(4):
            assert_close(got[rank][step], want[step][rank // 2])


def train_replica_of_fsdp(case, shape):
    """DiLoCo over mesh dim 0 ('replica'); each replica fully_shard over the rest: FSDP
    over 'dp_shard' on a (2, 2) mesh, HSDP over ('dp_replicate', 'dp_shard') on (2, 2, 2)."""
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    names = ("replica", "dp_replicate", "dp_shard") if len(shape) == 3 \
        else ("replica", "dp_shard")
    mesh = init_device_mesh(backend.device_type(), shape, mesh_dim_names=names)
    coord = mesh.get_coordinate()
    part = coord[1] if len(shape) == 2 else coord[1] * shape[2] + coord[2]
    return train_on_rank(case, replica_group=mesh["replica"], replica=coord[0],
                         parts=mesh.size() // shape[0], part=part,
                         fsdp_mesh=mesh[names[1:]])


@pytest.mark.parametrize("shape", [(2, 2), (2, 2, 2)], ids=["fsdp", "hsdp"])
def test_diloco_over_a_mesh_dimension_composes_with_sharded_replicas(shape):
    """Each DiLoCo replica is fully_shard over its ranks (FSDP, or HSDP on a 2-D sub-mesh):
    the whole parameters equal Algorithm 1 with one process per replica, to 1e-12."""
    case = case_of(world=2, seed=11, H=2, steps=5, batch=4)
    world = int(np.prod(shape))
    with World(world, timeout=20.0, run_timeout=120.0) as w:
        got = w.run(train_replica_of_fsdp, case.copy(), shape)
    want = simulate(case)
    for step in range(case["steps"]):
        for rank in range(world):
            assert_close(got[rank][step], want[step][rank // (world // 2)])

