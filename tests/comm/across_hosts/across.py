"""One MPI world across two hosts: everything test_across.py checks, in one start.

Run by test_across.py as ``mpiexec -hosts hosta:4,hostb:4 -n 8 python across.py``
inside scripts/two_hosts.py's two hosts. Every check raises on failure (an
uncaught exception aborts the job); rank 0 prints one ``RESULT {json}`` line per
part for the test to read:

- topology: every rank's host, node, LOCAL_RANK and LOCAL_WORLD_SIZE as found;
  the device mesh's tensor-parallel groups each inside one node
- collectives: every collective, algorithm and op of the comm suite against
  NumPy (tests/comm/cases.py: bitwise, integer-valued inputs), and the
  hierarchical all-reduce on the nodes found
- ddp / three_d: a DDP run and a dp=2 x pp=2 x tp=2 GPT run against one process
- bytes: what crossed the veth during the hierarchical all-reduce and the flat
  ring of M bytes, read from /sys/class/net/md0/statistics on each host by its
  local rank 0, less what two barriers alone move
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "comm"))
sys.path.insert(0, os.path.join(ROOT, "tests", "comm", "transport"))

import cases  # noqa: E402  (tests/comm/cases.py)
import mpi_collectives  # noqa: E402
from mpi4py import MPI  # noqa: E402

import minidist.distributed as dist  # noqa: E402
from minidist import backend  # noqa: E402

IFACE_STATS = "/sys/class/net/md0/statistics"
BYTES_COUNT = 1 << 19          # float64: M = 4 MiB
REPEATS = 2


def report(part: str, **fields) -> None:
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(dict(part=part, **fields)), flush=True)


def topology_part() -> None:
    topo = dist.get_topology()
    mine = dict(host=topo.hosts[dist.get_rank()], node=topo.node_of[dist.get_rank()],
                local_rank=int(os.environ["LOCAL_RANK"]),
                local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]))
    everyone = MPI.COMM_WORLD.gather(mine, root=0)
    mesh = dist.DeviceMesh(dp=2, pp=2, tp=2)
    tp_nodes = {topo.node_of[r] for r in mesh.ranks("tp")}
    assert len(tp_nodes) == 1, f"tp group {mesh.ranks('tp')} spans nodes {tp_nodes}"
    report("topology", ranks=everyone, pp_groups_cross_hosts=len(
        {topo.node_of[r] for r in mesh.ranks("pp")}) == 2)


def collectives_part() -> None:
    checked = mpi_collectives.check_all(rounds=1)
    rng = np.random.default_rng(99)
    for op in cases.OPS:                       # the hierarchical all-reduce, nodes found
        for _ in range(2):
            case = cases.random_case(rng, dist.get_world_size(), "all_reduce")
            case.update(algorithm="hierarchical", op=op, real=False)
            mpi_collectives._check(case, dist.get_rank(), MPI.COMM_WORLD)
            checked += 1
    report("collectives", checked=checked)


def ddp_part() -> None:
    from tests.parallel.data import ddp_cases as C
    case = dict(strategy="ddp", world=dist.get_world_size(), steps=2, micro=2, batch=2,
                d_in=5, hidden=8, d_out=3, dtype="float64", seed=11, optimizer="sgd")
    got = C.train_on_rank(case)["params"]
    err = C.max_diff(got, C.train_single(case))
    assert err <= 1e-12, f"rank {dist.get_rank()}: ddp differs from one process by {err}"
    report("ddp", max_err=max(MPI.COMM_WORLD.gather(err, root=0) or [0.0]))


def three_d_part() -> None:
    from tests.parallel import test_3d as T
    case = dict(schedule="1f1b", microbatches=2, virtual=1, tie=True, sp=False)
    dense = T.train_single(case)
    err, _, _ = T.train_3d(case, dense)
    assert err <= T.TOL, f"rank {dist.get_rank()}: 3D differs from one process by {err}"
    report("three_d", max_err=max(MPI.COMM_WORLD.gather(err, root=0) or [0.0]))


def _counters() -> tuple[int, int]:
    with open(f"{IFACE_STATS}/tx_bytes") as tx, open(f"{IFACE_STATS}/rx_bytes") as rx:
        return int(tx.read()), int(rx.read())


def _crossed(algorithm: str | None, count: int = BYTES_COUNT) -> dict:
    """host -> bytes its md0 sent while every rank ran ``REPEATS`` all-reduces of M bytes
    (None: none), between two barriers; read by each host's local rank 0."""
    x = backend.xp.ones(count)
    dist.barrier()
    before = _counters()
    dist.barrier()
    for _ in range(REPEATS if algorithm else 0):
        dist.all_reduce(x, algorithm=algorithm)
    dist.barrier()
    after = _counters()
    mine = (after[0] - before[0]) if os.environ["LOCAL_RANK"] == "0" else None
    topo = dist.get_topology()
    sent = MPI.COMM_WORLD.allgather(mine)
    return {topo.hosts[r]: b for r, b in enumerate(sent) if b is not None}


def bytes_part() -> None:
    topo = dist.get_topology()
    n, k = dist.get_world_size(), topo.num_nodes
    local = topo.node_size
    m = BYTES_COUNT * 8
    base = _crossed(None)
    rows = {}
    for algorithm in ("hierarchical", "ring"):
        got = _crossed(algorithm)
        rows[algorithm] = {h: (got[h] - base[h]) / REPEATS for h in got}
    report("bytes", world=n, nodes=k, local=local, m=m, barriers=base, sent=rows,
           hier_per_rank=2 * (k - 1) / k * m / local, ring_per_rank=2 * (n - 1) / n * m)


def bytes_table(mib: list[float]) -> None:
    """``--bytes 1,4,16``: the table of docs/running.md, one row per size and algorithm."""
    topo = dist.get_topology()
    n, k, local = dist.get_world_size(), topo.num_nodes, topo.node_size
    base = _crossed(None)
    if dist.get_rank() == 0:
        print(f"{n} ranks, {k} hosts x {local}; bytes sent by each host's md0 per all-reduce")
        print(f"{'M':>8} {'algorithm':<13} {'formula':>12} {'hosta':>12} {'hostb':>12} "
              f"{'overhead':>9}")
    for size in mib:
        count = int(size * 2 ** 20) // 8
        m = count * 8
        formula = {"hierarchical": 2 * (k - 1) / k * m,          # L ranks x 2(K-1)/K M/L
                   "ring": 2 * (n - 1) / n * m}   # the one rank whose neighbour is away
        for algorithm in ("hierarchical", "ring"):
            got = _crossed(algorithm, count)
            sent = {h: (got[h] - base[h]) / REPEATS for h in got}
            if dist.get_rank() == 0:
                over = max(sent.values()) / formula[algorithm] - 1
                print(f"{size:>6g}Mi {algorithm:<13} {formula[algorithm]:>12,.0f} "
                      f"{sent['hosta']:>12,.0f} {sent['hostb']:>12,.0f} {over:>8.2%}",
                      flush=True)


def main() -> None:
    dist.init_process_group(timeout=60.0)
    if "--bytes" in sys.argv:
        bytes_table([float(v) for v in sys.argv[sys.argv.index("--bytes") + 1].split(",")])
        dist.destroy_process_group()
        return
    topology_part()
    collectives_part()
    ddp_part()
    three_d_part()
    bytes_part()
    dist.barrier()
    report("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
