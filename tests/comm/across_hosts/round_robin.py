"""Ranks placed round-robin across two hosts (mpiexec -hosts hosta,hostb -n 4: a, b, a, b).

Run by test_across.py. The nodes found are {0, 2} and {1, 3}; the device mesh
fills its grid node by node, so its tensor-parallel groups are [0, 2] and
[1, 3], each on one host; the hierarchical all-reduce goes by the nodes found.
Rank 0 prints ``RESULT {json}``; any failed check raises and aborts the job.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))                             # tests/comm: cases.py
import cases  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist import backend  # noqa: E402


def main() -> None:
    dist.init_process_group(timeout=60.0)
    rank, topo = dist.get_rank(), dist.get_topology()
    mesh = dist.DeviceMesh(dp=2, tp=2)
    tp = mesh.ranks("tp")
    assert len({topo.hosts[r] for r in tp}) == 1, f"tp group {tp} spans hosts"
    x = backend.from_host(np.array([float(rank)]))
    dist.all_reduce(x, group=mesh.group("tp"))
    assert float(backend.to_host(x)[0]) == sum(tp)
    rng = np.random.default_rng(5)
    for op in cases.OPS:
        case = cases.random_case(rng, dist.get_world_size(), "all_reduce")
        case.update(algorithm="hierarchical", op=op, real=False)
        got, want = cases.run_case(case), cases.expected(case)[rank]
        assert cases.same(got, want), f"rank {rank}: hierarchical {case}"
    flat = dist.DeviceMesh(dp=4)                  # grid order kept: no group out of order
    assert flat.ranks("dp") == [0, 1, 2, 3]
    if rank == 0:
        print("RESULT " + json.dumps(dict(hosts=list(topo.hosts), nodes=topo.nodes(),
                                          local_ranks=list(topo.local_ranks), tp=tp)),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
