"""Diagnostics (exercise 35.23): per-rank gradient norms, loss sync, comm timing."""
import pytest

from minidist.comm import World


def _world_case(corrupt: bool):
    from minidist.autograd import Tensor
    from minidist.backend import Generator
    from minidist.distributed import get_rank
    from minidist.nn import Linear
    from minidist.parallel import DataParallelNaive
    from minidist.parallel.diagnostics import (check_loss_sync, comm_breakdown,
                                               grad_norms_per_rank)
    rank = get_rank()
    model = DataParallelNaive(Linear(4, 3, generator=Generator(0)))
    x = Tensor(Generator(10 + rank).normal((5, 4)))
    (model(x) * model(x)).mean().backward()
    before = grad_norms_per_rank(model.parameters())
    model.sync_gradients()
    if corrupt and rank == 1:
        model.module.weight.grad.reshape(-1)[0] += 1e-6
    after = grad_norms_per_rank(model.parameters())
    loss = check_loss_sync(1.0 + (1e-9 if corrupt and rank == 1 else 0.0))
    rows = comm_breakdown(10.0)
    return before, after, loss.in_sync, rows


@pytest.fixture(scope="module")
def world():
    with World(3) as w:
        yield w


def test_norms_differ_before_sync_and_agree_bitwise_after(world):
    results = world.run(_world_case, False)
    before, after, in_sync, _ = results[0]
    assert len(set(before)) == 3                      # each rank saw its own data
    assert len(set(after)) == 1                       # the same gradient everywhere
    assert in_sync and all(r[1] == after for r in results)


def test_a_corrupted_rank_and_a_wrong_logged_loss_are_flagged(world):
    _, after, in_sync, _ = world.run(_world_case, True)[0]
    assert [r for r, n in enumerate(after) if n != after[0]] == [1]
    assert not in_sync


def test_comm_breakdown_accounts_for_the_whole_step(world):
    rows = world.run(_world_case, False)[0][3]
    names = [r[0] for r in rows]
    assert "all_reduce" in names and "all_gather" in names and names[-1].startswith("compute")
    assert sum(r[3] for r in rows) == pytest.approx(10.0)
    assert all(r[3] >= 0 for r in rows)

