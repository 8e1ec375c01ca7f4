"""Demo 19: where each rank runs: host, node, local rank, and the hierarchical all-reduce on it.

Under mpiexec every rank all-gathers the host names and finds which ranks share
a machine (minidist/comm/transport/topology.py): the nodes, LOCAL_RANK and
LOCAL_WORLD_SIZE (set in the environment as torchrun does). Rank 0 prints one
line per rank, then every rank runs the hierarchical all-reduce with the nodes
found and checks it against the sum NumPy computes in one process, and the
bytes it sent between nodes against 2(K-1)/K * M / L.

    mpiexec -n 4 python demos/19_topology.py                       # one host: one node
    MINIDIST_NODE_SIZE=2 mpiexec -n 4 python demos/19_topology.py  # two nodes of 2 on it
    mpiexec -f hostfile -n 8 python demos/19_topology.py           # across machines
    python demos/19_topology.py -n 4 --node-size 2                 # a local world, declared

scripts/two_hosts.py runs it on two hosts made of this one machine.
"""
import argparse
import os
import sys

import numpy as np

from minidist.comm import World
import minidist.distributed as dist
from minidist import backend
from _args import positive_int

COUNT = 4096  # float64 values all-reduced: M = 32 KiB


def worker() -> tuple:
    """(this rank's line, the all-reduce result, bytes sent between nodes)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    topo = dist.get_topology()
    if topo is None:
        return f"rank {rank}: one level, no nodes declared", None, 0, 1
    x = backend.from_host(np.arange(COUNT, dtype=np.float64) * (rank + 1))
    before = dist.get_stats().inter_node_bytes
    dist.all_reduce(x, algorithm="hierarchical")
    inter = dist.get_stats().inter_node_bytes - before
    env = f"LOCAL_RANK={os.environ.get('LOCAL_RANK')} LOCAL_WORLD_SIZE=" \
          f"{os.environ.get('LOCAL_WORLD_SIZE')}"
    return f"{topo.describe(rank)}; {env}", backend.to_host(x), inter, topo.num_nodes


def gathered(mine: tuple) -> list:
    """Every rank's tuple, on rank 0 (under mpiexec each rank holds only its own)."""
    line = np.frombuffer(mine[0].encode().ljust(256)[:256], dtype=np.uint8)
    lines = [backend.xp.zeros(256, dtype=backend.xp.uint8) for _ in range(dist.get_world_size())]
    dist.all_gather(lines, backend.from_host(line.copy()))
    texts = [bytes(backend.to_host(t)).decode().rstrip() for t in lines]
    inter = backend.from_host(np.array([mine[2]], dtype=np.int64))
    everyone = [backend.xp.zeros(1, dtype=backend.xp.int64) for _ in lines]
    dist.all_gather(everyone, inter)
    return [(text, mine[1], int(backend.to_host(b)[0]), mine[3])
            for text, b in zip(texts, everyone)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4,
                        help="ranks of a local world (ignored under mpiexec)")
    parser.add_argument("--node-size", type=positive_int, default=2,
                        help="ranks per declared node of a local world (ignored under mpiexec)")
    args = parser.parse_args()
    if args.world_size % args.node_size:
        parser.error(f"--node-size {args.node_size} must divide -n {args.world_size}")

    if dist.launched():
        dist.init_process_group()
        n = dist.get_world_size()
        results = gathered(worker())
        if dist.get_rank() != 0:
            sys.exit(0)       # rank 0 prints and checks
    else:
        n = args.world_size
        with World(n, node_size=args.node_size) as world:
            results = world.run(worker)
    for line, *_ in results:
        print(line)
    _, got, _, nodes = results[0]
    if got is None:
        print("check: one level, nothing to reduce hierarchically: ok")
        sys.exit(0)
    want = sum(np.arange(COUNT, dtype=np.float64) * (r + 1) for r in range(n))
    local = n // nodes
    formula = 2 * (nodes - 1) / nodes * COUNT * 8 / local
    inter = [b for _, _, b, _ in results]
    ok = np.array_equal(got, want) and all(b == formula for b in inter)
    print(f"check: hierarchical all-reduce on {nodes} node(s) of {local}: max |got - want| = "
          f"{float(np.max(np.abs(got - want))):.1e}, bytes between nodes per rank {inter} "
          f"= 2(K-1)/K * M/L = {formula:g}: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
