"""Demo 02: every collective on 4 processes, each checked against NumPy.

Starts a world of 4 processes (minidist.launch), runs broadcast, reduce,
all_reduce (four algorithms), all_gather, reduce_scatter, gather, scatter,
all_to_all and barrier, and prints what rank 0 got next to the answer one
process computes with NumPy, with the bytes rank 0 sent.

    python demos/02_collectives.py          # ~2 s
    python demos/02_collectives.py -n 3     # any world size
    minidist run -n 4 demos/02_collectives.py    # the same, started like torchrun
    mpiexec -n 4 python demos/02_collectives.py  # the same, on the MPI transport

Every collective is built from point-to-point sends and receives
(minidist/comm/collectives/api.py); the check printed is max |got - want| = 0.
"""
import argparse
import sys

import numpy as np

import minidist
import minidist.distributed as dist
from minidist import backend
from _args import positive_int


def rank_data(rank: int) -> np.ndarray:
    """What rank r starts with: [r*10, r*10 + 1, r*10 + 2, r*10 + 3]."""
    return np.arange(4, dtype=np.float64) + 10 * rank


def worker() -> list:
    """Runs on every rank; returns (name, what this rank got, bytes it sent)."""
    r, n = dist.get_rank(), dist.get_world_size()
    xp, h, d = backend.xp, backend.to_host, backend.from_host
    out = []

    def record(name, value):
        out.append((name, None if value is None else np.array(value),
                    dist.get_stats().last.get("bytes_sent", 0)))

    x = d(rank_data(r))
    dist.broadcast(x, src=0)
    record("broadcast(src=0)", h(x))

    x = d(rank_data(r))
    dist.reduce(x, dst=0)
    record("reduce(dst=0)", h(x) if r == 0 else None)

    for alg in ("naive", "tree", "recursive_doubling", "ring"):
        x = d(rank_data(r))
        dist.all_reduce(x, op=dist.ReduceOp.SUM, algorithm=alg)
        record(f"all_reduce({alg})", h(x))

    x = d(rank_data(r))
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    record("all_reduce(MAX)", h(x))

    parts = [xp.zeros(4) for _ in range(n)]
    dist.all_gather(parts, d(rank_data(r)))
    record("all_gather", np.stack([h(p) for p in parts]))

    mine = xp.zeros(1)
    dist.reduce_scatter(mine, [d(rank_data(r)[i % 4:i % 4 + 1]) for i in range(n)])
    record("reduce_scatter", h(mine))

    parts = [xp.zeros(4) for _ in range(n)] if r == 0 else None
    dist.gather(d(rank_data(r)), parts, dst=0)
    record("gather(dst=0)", np.stack([h(p) for p in parts]) if r == 0 else None)

    got = xp.zeros(4)
    dist.scatter(got, [d(rank_data(i) + 100) for i in range(n)] if r == 0 else None, src=0)
    record("scatter(src=0)", h(got))

    outs = [xp.zeros(1) for _ in range(n)]
    dist.all_to_all(outs, [d(np.array([100.0 * r + j])) for j in range(n)])
    record("all_to_all", np.concatenate([h(o) for o in outs]))

    dist.barrier()
    record("barrier", None)
    return out


def gathered_to_rank_0(mine: list) -> list:
    """Under minidist run / mpiexec each rank holds only its own results; rank 0
    gathers every rank's all_reduce results (all it needs from the others)."""
    rows = backend.from_host(np.stack([got for name, got, _ in mine
                                       if name.startswith("all_reduce")]))
    everyone = [backend.xp.zeros_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, rows)
    names = [name for name, _, _ in mine if name.startswith("all_reduce")]
    return [mine] + [[(name, backend.to_host(r)[i], 0) for i, name in enumerate(names)]
                     for r in everyone[1:]]


def shown_values(got: np.ndarray, most: int = 6) -> str:
    """``[0, 1, 2, 3, 10, 11, ...] 16 values``: the first values (whole numbers here),
    and how many there are when not all are shown."""
    values = got.ravel()
    text = ", ".join(f"{v:g}" for v in values[:most])
    if values.size > most:
        return f"[{text}, ...] {values.size} values"
    return f"[{text}]"


def expected(n: int) -> dict:
    """What rank 0 must hold after each collective, computed in one process."""
    xs = [rank_data(r) for r in range(n)]
    total = np.sum(xs, axis=0)
    want = {"broadcast(src=0)": xs[0], "reduce(dst=0)": total, "all_reduce(MAX)": np.max(xs, axis=0),
            "all_gather": np.stack(xs), "reduce_scatter": np.array([sum(x[0] for x in xs)]),
            "gather(dst=0)": np.stack(xs), "scatter(src=0)": xs[0] + 100,
            "all_to_all": np.array([100.0 * s + 0 for s in range(n)]), "barrier": None}
    for alg in ("naive", "tree", "recursive_doubling", "ring"):
        want[f"all_reduce({alg})"] = total
    return want


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4)
    args = parser.parse_args()
    n = args.world_size

    if dist.launched():  # minidist run / mpiexec started us: we are one rank of the world
        dist.init_process_group()
        n = dist.get_world_size()
        results = gathered_to_rank_0(worker())
        if dist.get_rank() != 0:
            sys.exit(0)      # rank 0 prints and checks
    else:
        results = minidist.launch(worker, n)
    want = expected(n)
    print(f"{n} processes; rank r starts with [10r, 10r+1, 10r+2, 10r+3]\n")
    print(f"{'collective':<30} {'rank 0 got':<36} {'bytes sent':>10}  check")
    worst = 0.0
    for name, got, sent in results[0]:
        w = want[name]
        if w is None:
            err, shown = 0.0, "-"
        else:
            err = float(np.max(np.abs(got - w)))
            shown = shown_values(got)
        worst = max(worst, err)
        print(f"{name:<30} {shown:<36} {sent:>10}  max |got - want| = {err:.1e}")
    ours = {name: got for name, got, _ in results[0]}
    same = all(np.array_equal(ours[name], got) for other in results[1:]
               for name, got, _ in other if name.startswith("all_reduce"))
    ok = worst == 0.0 and same
    print(f"\ncheck: max |got - want| over all collectives = {worst:.1e} (must be 0), "
          f"all_reduce bitwise identical on every rank: {same}: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
