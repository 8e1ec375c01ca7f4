"""The collective checks of test_collectives.py, on the MPI transport.

Run by test_mpi.py as ``mpiexec -n N python tests/comm/transport/mpi_collectives.py``.
Every rank draws the same random cases (seeded), runs them through
minidist.distributed (which picked the MPI transport from mpiexec's
environment), and compares its result with the NumPy reference. Any failure
raises, and the uncaught exception aborts the whole MPI job with a non-zero
exit status.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/comm: cases.py
import cases  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist import backend  # noqa: E402

ROUNDS = int(os.environ.get("MINIDIST_MPI_ROUNDS", "6"))


def main() -> None:
    group = dist.init_process_group()
    assert group.transport.name == "mpi", group.transport.name
    checked = check_all(ROUNDS)
    if dist.get_rank() == 0:
        print(f"mpi: {checked} collective cases passed on {dist.get_world_size()} ranks",
              flush=True)
    dist.destroy_process_group()


def check_all(rounds: int) -> int:
    """Every collective, algorithm and op against NumPy, ``rounds`` times with new
    draws, then the mismatch checks, point to point and groups; the cases checked."""
    from mpi4py import MPI
    rank, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(1234)
    checked = 0
    for _ in range(rounds):
        for name in cases.COLLECTIVES:
            case = cases.random_case(rng, n, name)
            if case.get("algorithm") == "direct":  # not over MPI: tested below
                case["algorithm"] = "auto"
            _check(case, rank, MPI.COMM_WORLD)
            checked += 1
        for algorithm in cases.ALGORITHMS:  # every algorithm and op of all_reduce
            if algorithm == "direct":  # MPI ranks do not read each other: it says so
                try:
                    dist.all_reduce(backend.xp.ones(4), algorithm="direct")
                    raise AssertionError("all_reduce(algorithm='direct') ran over MPI")
                except ValueError as e:
                    assert "cannot read its peers' memory" in str(e), str(e)
                continue
            for op in cases.OPS:
                case = cases.random_case(rng, n, "all_reduce")
                case.update(algorithm=algorithm, op=op, real=False)
                _check(case, rank, MPI.COMM_WORLD)
                checked += 1

    # A mismatch is an error on every rank, and the world stays usable after it.
    try:
        dist.all_reduce(backend.xp.ones(4 + (rank == 1)))
        raise AssertionError("a shape mismatch went unnoticed")
    except dist.CollectiveMismatchError as e:
        assert "differ in shape" in str(e), str(e)
    # A small all-reduce (its check in its data messages) against a broadcast
    # (a separate check): blocks of different sizes, found with a matched probe.
    try:
        if rank == 1:
            dist.broadcast(backend.xp.ones(4), src=0)
        else:
            dist.all_reduce(backend.xp.ones(4))
        raise AssertionError("all_reduce against broadcast went unnoticed")
    except dist.CollectiveMismatchError as e:
        assert "differ in" in str(e) and "collective" in str(e), str(e)

    # Point to point, the fused receive-and-reduce, and groups.
    x = backend.from_host(np.arange(5000.0))
    if rank == 0:
        dist.send(x, dst=1, tag=9)
    elif rank == 1:
        dist.recv_reduce(x, src=0, tag=9)
        assert np.array_equal(backend.to_host(x), 2 * np.arange(5000.0))
    if n == 4:
        mesh = dist.DeviceMesh(dp=2, tp=2)
        y = backend.xp.ones(3) * rank
        dist.all_reduce(y, group=mesh.group("dp"))
        assert float(backend.to_host(y)[0]) == sum(mesh.ranks("dp"))
    dist.barrier()
    return checked


def _check(case, rank, comm) -> None:
    got = cases.run_case(case)
    want = cases.expected(case)[rank]
    if case.get("real"):
        assert cases.close(got, want), case
        # bitwise identical on every rank: compare with rank 0's bytes
        mine = np.asarray(got).tobytes()
        assert comm.bcast(mine, root=0) == mine, f"rank {rank} differs from rank 0: {case}"
    else:
        assert cases.same(got, want), f"rank {rank}: {case}\n got {got}\n want {want}"


if __name__ == "__main__":
    main()
