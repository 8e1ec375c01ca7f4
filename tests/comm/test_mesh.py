"""The device mesh hands every rank its data / pipeline / tensor groups."""


def _mesh():
    import minidist.distributed as dist
    from minidist import backend
    mesh = dist.DeviceMesh(dp=2, pp=2, tp=2)
    x = backend.xp.ones(3) * dist.get_rank()
    dist.all_reduce(x, group=mesh.group("tp"))  # sums the ranks of my TP group
    return mesh.coord, {d: mesh.ranks(d) for d in ("dp", "pp", "tp")}, float(backend.to_host(x)[0])


def test_mesh_splits_8_ranks_into_dp_pp_tp_groups(worlds):
    results = worlds.get(8).run(_mesh)
    for rank, (coord, ranks, tp_sum) in enumerate(results):
        assert rank == (coord["pp"] * 2 + coord["dp"]) * 2 + coord["tp"]
        assert ranks["tp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert ranks["dp"] == sorted({(coord["pp"] * 2 + d) * 2 + coord["tp"] for d in (0, 1)})
        assert ranks["pp"] == sorted({(p * 2 + coord["dp"]) * 2 + coord["tp"] for p in (0, 1)})
        assert tp_sum == sum(ranks["tp"])


def _subgroup():
    import minidist.distributed as dist
    from minidist.backend import xp, to_host
    g = dist.new_group([1, 3])
    if g is dist.NON_GROUP_MEMBER:
        return dist.get_rank(g)
    x = xp.ones(2) * dist.get_rank()
    dist.broadcast(x, src=3, group=g)
    return dist.get_rank(g), float(to_host(x)[0])


def test_new_group_numbers_ranks_within_the_group(worlds):
    assert worlds.get(4).run(_subgroup) == [-1, (0, 3.0), -1, (1, 3.0)]
