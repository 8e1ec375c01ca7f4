"""Bad input gets an error that names what was wrong, on every rank, without a hang."""
from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2])


def _message(fn):
    try:
        fn()
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def errors_case(_):
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    xp = backend.xp
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    other = init_device_mesh(backend.device_type(), (1, 2), mesh_dim_names=("dp", "tp"))
    x = distribute_tensor(xp.ones((4, 3)), mesh, [Shard(0)])
    rank = mesh.get_rank()
    return {
        "length": _message(lambda: distribute_tensor(xp.ones((4, 3)), mesh,
                                                     [Shard(0), Replicate()])),
        "dim": _message(lambda: distribute_tensor(xp.ones((4, 3)), mesh, [Shard(2)])),
        "mesh": _message(lambda: x.redistribute(other, [Replicate(), Replicate()])),
        "from_local": _message(lambda: DTensor.from_local(xp.ones((2 + rank, 3)), mesh,
                                                          [Shard(1)], run_check=True)),
        "from_local_rows": _message(lambda: DTensor.from_local(
            xp.ones((1 + 2 * rank, 3)), mesh, [Shard(0)], run_check=True, shape=(4, 3))),
        "name": _message(lambda: mesh["dp"]),
        "device": _message(lambda: init_device_mesh(
            "cpu" if backend.device_type() == "cuda" else "cuda", (2,))),
        "world": _message(lambda: init_device_mesh(backend.device_type(), (3,))),
    }


def test_bad_input_is_a_clear_error(world):
    for found in world.run(errors_case, None):
        assert "2 placements" in found["length"] and "mesh of 1 dimensions" in found["length"]
        assert "Shard(dim=2) is out of range" in found["dim"]
        assert "another mesh" in found["mesh"]
        assert "disagree" in found["from_local"] and "(2, 3)" in found["from_local"]
        assert "torch.chunk" in found["from_local_rows"] and "[1, 3]" in found["from_local_rows"]
        assert "no dimension named 'dp'" in found["name"]
        assert f"use '{backend.device_type()}'" in found["device"]
        assert "3 ranks but the world has 2" in found["world"]
