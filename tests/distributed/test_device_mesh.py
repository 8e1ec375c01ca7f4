"""init_device_mesh lays ranks out row-major, as torch.arange(world).reshape(shape) does,
and hands every rank the group of each dimension and the sub-mesh of named dimensions."""
import numpy as np

from tests.distributed.worlds import world_fixture

world = world_fixture([6])


def mesh_case(shape):
    import minidist.distributed as dist
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(backend.device_type(), shape, mesh_dim_names=("dp", "tp"))
    x = backend.xp.ones(1) * dist.get_rank()
    dist.all_reduce(x, group=mesh.get_group("tp"))          # sums my tp ranks
    tp = mesh["tp"]
    return (mesh.get_coordinate(), mesh.mesh, tp.mesh, tp.get_local_rank(),
            mesh.get_group("dp").ranks, float(backend.to_host(x)[0]), mesh.size())


def test_mesh_is_row_major_with_a_group_per_dimension(world):
    shape = (2, 3)
    grid = np.arange(6).reshape(shape)
    for rank, (coord, ranks, tp_ranks, tp_rank, dp_ranks, tp_sum, size) in enumerate(
            world.run(mesh_case, shape)):
        assert grid[tuple(coord)] == rank
        assert ranks == grid.tolist() and size == 6
        assert tp_ranks == grid[coord[0]].tolist() and tp_rank == coord[1]
        assert dp_ranks == grid[:, coord[1]].tolist()
        assert tp_sum == sum(tp_ranks)


def flattened_case():
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(backend.device_type(), (2, 3), mesh_dim_names=("dp", "tp"))
    mesh["dp", "tp"]._flatten("dp_tp")
    return mesh.get_group("dp_tp") is mesh["dp_tp"].get_group(), mesh.get_group("dp_tp").ranks


def test_the_root_mesh_answers_a_flattened_name_in_get_group(world):
    """torch's root mesh gives a ``_flatten`` name's group as its sub-mesh does."""
    for same, ranks in world.run(flattened_case):
        assert same and list(ranks) == list(range(6))
