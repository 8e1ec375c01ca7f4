"""DDP, Top-K, 1-bit Adam, HSDP, DiLoCo and Streaming DiLoCo across a slow link.

    python bench/bench_diloco.py            # 2 islands x 2 ranks, 2 GB/s inside, 0.1 between

Four ranks as two islands of two (``World(node_size=2)``): the emulated link carries
``--fast-gbps`` inside an island and ``--slow-gbps`` between them
(comm/transport/link.py). The same MLP (``--layers`` Linear(width, width) with tanh
between, float32) takes AdamW steps on a fixed batch per rank, each way:

    local                    no communication: the compute time c of a step
    DDP                      all-reduce over the 4 ranks every step
    DDP + Top-K              the Top-K hook with error feedback (density 1%)
    1-bit Adam               OnebitAdam, measured after its warm-up (signs + scales)
    HSDP                     fully_shard on the (island, local) mesh: shard inside an island
    DiLoCo H (DDP inside)    DDP inside each island, DiLoCo between islands; each rank of
                             an island sends half of the outer gradient (shard_group)
    DiLoCo H (FSDP inside)   fully_shard inside each island, DiLoCo between islands
    Streaming F              the same with F fragments, tau = 1, alpha = 0.5

Per strategy it prints the time of a step (the slowest rank's mean over ``--steps``
measured steps, after ``--warmup``), the bytes each rank put on the slow link per step
(``dist.get_link_bytes()``: the mean over ranks and steps, and the largest step), both
relative to DDP's in the same run, and the step time that ``calc`` predicts
(minidist/calc/diloco.py; HSDP from calc/comm.py): compute plus the exposed wire (for
DDP, the wire less its all-reduce's own copies, which run while the bytes are on it:
calc/diloco.py). The compute time c of each strategy is measured too, as its step time
in a second world of the same four ranks without the emulated link: the arithmetic,
the compression (Top-K's selection, 1-bit Adam's signs) and the copies that move bytes,
all but the wire.

Each of ``--repeats`` rounds runs every strategy once without the link and once with
it, one after the other, so that a round's c and its step time see the same load; the
round's calc comes from its own c's. The table gives the median over the rounds of each
figure, meas/calc the median of the rounds' ratios, and "spread" their least and
largest. Times on a shared machine vary from run to run; the bytes do not.
"""
from __future__ import annotations

import argparse
import contextlib
import time

from _args import positive, positive_int

RUNS = ("local", "DDP", "DDP + Top-K", "1-bit Adam", "HSDP", "DiLoCo (DDP inside)",
        "DiLoCo (FSDP inside)", "Streaming (FSDP inside)")


def mlp(width: int, layers: int):
    """``layers`` Linear(width, width), tanh between, seed 0."""
    from minidist.backend import Generator
    from minidist.nn import Linear, Module, Sequential

    class Tanh(Module):
        def forward(self, x):
            return x.tanh()
    gen, parts = Generator(0), []
    for i in range(layers):
        parts += [Linear(width, width, generator=gen)] + ([Tanh()] if i < layers - 1 else [])
    return Sequential(*parts)


def build(how: str, model, args):
    """(the forward to call, the inner optimizer, the context to train in)."""
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import Linear
    from minidist.optim import SGD, AdamW
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.data.onebit_adam import OnebitAdam
    from minidist.parallel.data.topk import TopKState, topk_hook
    from minidist.parallel.diloco import DiLoCo
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("island", "local"))
    linears = [m for m in model if isinstance(m, Linear)]
    forward, nothing = model, contextlib.nullcontext()
    if how == "1-bit Adam":
        return model, OnebitAdam(model.parameters(), lr=args.lr, freeze_step=args.warmup), nothing
    if how in ("DDP", "DDP + Top-K"):
        forward = DistributedDataParallel(model)
        if how == "DDP + Top-K":
            forward.register_comm_hook(TopKState(None, density=args.density), topk_hook)
    elif how == "HSDP" or "FSDP inside" in how:
        shard_over = mesh if how == "HSDP" else mesh["local"]
        for layer in linears:
            fully_shard(layer, mesh=shard_over)
        fully_shard(model, mesh=shard_over)
    elif how == "DiLoCo (DDP inside)":
        forward = DistributedDataParallel(model, group=mesh.get_group("local"))
    shard_group = mesh["local"] if how == "DiLoCo (DDP inside)" else None   # its 2 copies
    inner = AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if not how.startswith(("DiLoCo", "Streaming")):
        return forward, inner, nothing
    outer = SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    streaming = how.startswith("Streaming")
    half = len(linears) // 2
    fragments = [linears[:half], linears[half:]] if streaming else None
    return forward, inner, DiLoCo(model, inner, outer, sync_every=args.sync_every,
                                  group=mesh["island"], fragments=fragments,
                                  fragment_sync_delay=1 if streaming else 0,
                                  fragment_update_alpha=0.5 if streaming else 0.0,
                                  shard_group=shard_group)


def _between() -> int:
    """The bytes this rank has put on the slow links (0 in a world without a link)."""
    import minidist.distributed as dist
    link = dist.get_link_bytes()
    return link.between if link is not None else 0


def run_rank(args, how: str) -> dict:
    """This rank's seconds per measured step and slow-link bytes of each measured step."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import Generator, xp
    model = mlp(args.width, args.layers)
    forward, inner, context = build(how, model, args)
    data = Generator(100 + dist.get_rank())
    x = data.normal((args.batch, args.width))
    y = xp.tanh(data.normal((args.batch, args.width)))
    between, start, seen = [], 0.0, _between()
    with context:
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                dist.barrier()
                start, seen = time.perf_counter(), _between()   # not the barrier's bytes
            diff = forward(Tensor(x)) - Tensor(y)
            (diff * diff).mean().backward()
            inner.step()                       # DiLoCo: every H-th (H/F-th) also syncs
            inner.zero_grad()
            # one reading per step boundary: a streaming all-reduce in the background
            # thread may put bytes on the link between the end of a step and the next
            now = _between()
            between.append(now - seen)
            seen = now
        seconds = time.perf_counter() - start
    return dict(step_s=seconds / args.steps, between=between[args.warmup:])


def summarise(ranks: list[dict]) -> dict:
    """The slowest rank's step time; slow-link bytes per rank per step (mean, peak)."""
    steps = len(ranks[0]["between"])
    per_step = [sum(r["between"][s] for r in ranks) / len(ranks) for s in range(steps)]
    return dict(step_s=max(r["step_s"] for r in ranks), bytes=sum(per_step) / steps,
                peak=max(per_step))


def predictions(c: dict, m: float, args) -> dict:
    """Step seconds that calc predicts from each run's compute time c[run] (measured
    without the link) and the link: compute + exposed wire."""
    from minidist.calc.comm import all_gather_time, ring_all_reduce_time
    from minidist.calc.diloco import diloco_costs
    fast, slow, H, F = args.fast_gbps * 1e9, args.slow_gbps * 1e9, args.sync_every, 2

    def cost(run, model_bytes, ranks, compute, row, delay=1, copies=0.0):
        return diloco_costs(model_bytes, ranks, H, F, 32, compute, slow, delay=delay,
                            density=args.density, copies=copies)[row].step_seconds
    inside_fsdp = 3 * m / 2 / fast              # AG forward, AG backward, RS: (S-1)/S * M
    # DDP's all-reduce inside the island every step; the island's all-gather of the
    # outer gradient's two halves once every H steps
    c_ddp = c["DiLoCo (DDP inside)"] + ring_all_reduce_time(m, 2, fast) \
        + all_gather_time(m, 2, fast) / H
    # DDP's one bucket (1 MB < 25 MB) is all-reduced after backward: no overlap with
    # compute, but the all-reduce's own copies (c["DDP"] - c["local"]) run while its
    # bytes are on the wire
    copies = max(0.0, c["DDP"] - c["local"])
    return {"local": c["local"], "DDP": cost("DDP", m, 4, c["DDP"], 0, copies=copies),
            "DDP + Top-K": cost("Top-K", m, 4, c["DDP + Top-K"], 4),
            "1-bit Adam": cost("1-bit", m, 4, c["1-bit Adam"], 5),
            "HSDP": c["HSDP"] + inside_fsdp + ring_all_reduce_time(m / 2, 2, slow),
            "DiLoCo (DDP inside)": cost("DiLoCo", m / 2, 2, c_ddp, 1),
            "DiLoCo (FSDP inside)": cost("DiLoCo", m / 2, 2,
                                         c["DiLoCo (FSDP inside)"] + inside_fsdp, 1),
            "Streaming (FSDP inside)": cost("Streaming", m / 2, 2,
                                            c["Streaming (FSDP inside)"] + inside_fsdp, 2)}


def _median(values: list[float]) -> float:
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def report(rounds: list[tuple[dict, dict]], m: float, args) -> None:
    """The table over the rounds, each round (results, compute) of every strategy."""
    calcs = [predictions(compute, m, args) for _, compute in rounds]

    def over_rounds(figure) -> list[float]:
        return [figure(results, compute, calc) for (results, compute), calc in zip(rounds, calcs)]
    print(f"{'run':<25}{'step ms':>9}{'vs DDP':>8}{'c ms':>8}{'calc ms':>9}{'meas/calc':>10}"
          f"{'spread':>12}{'slow KB/step':>13}{'vs DDP':>8}{'peak KB':>9}")
    bytes_of, ratio_of = rounds[0][0], {}    # the bytes are the same in every round
    ddp = bytes_of["DDP"]
    for how in RUNS:
        step = over_rounds(lambda r, c, k: r[how]["step_s"])
        vs_ddp = over_rounds(lambda r, c, k: r[how]["step_s"] / r["DDP"]["step_s"])
        ratios = over_rounds(lambda r, c, k: r[how]["step_s"] / k[how])
        ratio_of[how] = _median(ratios)
        c = _median(over_rounds(lambda r, c, k: c[how]))
        calc = _median(over_rounds(lambda r, c, k: k[how]))
        b = bytes_of[how]
        print(f"{how:<25}{1e3 * _median(step):>9.2f}{_median(vs_ddp):>8.3f}{1e3 * c:>8.2f}"
              f"{1e3 * calc:>9.2f}{ratio_of[how]:>10.2f}"
              f"{f'{min(ratios):.2f}-{max(ratios):.2f}':>12}"
              f"{b['bytes'] / 1e3:>13.1f}{b['bytes'] / ddp['bytes']:>8.4f}{b['peak'] / 1e3:>9.1f}")
    H = args.sync_every
    diloco, streaming = bytes_of["DiLoCo (FSDP inside)"], bytes_of["Streaming (FSDP inside)"]
    within = [how for how in RUNS if abs(ratio_of[how] - 1) <= 0.15]
    print(f"\nDiLoCo (FSDP inside) slow bytes/step x H = {diloco['bytes'] * H / ddp['bytes']:.3f}"
          f" of DDP's (<= 1: {diloco['bytes'] * H <= ddp['bytes']}); "
          f"DiLoCo (DDP inside): {bytes_of['DiLoCo (DDP inside)']['bytes'] * H / ddp['bytes']:.3f}")
    ratio = streaming["peak"] / diloco["peak"]
    print(f"Streaming peak / DiLoCo peak = {ratio:.4f} (<= 1/F = 0.5: "
          f"{ratio <= 0.5})")
    print(f"step time within 15% of calc (median of {len(rounds)} rounds): {len(within)} of "
          f"{len(RUNS)} ({', '.join(within)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=positive_int, default=256)
    ap.add_argument("--layers", type=positive_int, default=4, help="an even number")
    ap.add_argument("--batch", type=positive_int, default=32, help="rows per rank")
    ap.add_argument("--steps", type=positive_int, default=20, help="measured, a multiple of H")
    ap.add_argument("--warmup", type=positive_int, default=2)
    ap.add_argument("--repeats", type=positive_int, default=5,
                    help="rounds; the median of each figure")
    ap.add_argument("--sync-every", type=positive_int, default=10)
    ap.add_argument("--density", type=positive, default=0.01)
    ap.add_argument("--lr", type=positive, default=1e-3)
    ap.add_argument("--fast-gbps", type=positive, default=2.0)
    ap.add_argument("--slow-gbps", type=positive, default=0.1)
    args = ap.parse_args()
    if args.layers % 2 or args.steps % args.sync_every or args.sync_every % 2:
        ap.error("--layers and --sync-every must be even, --steps a multiple of --sync-every")
    from minidist.comm import World
    rounds = []                                # (results, compute) of each round
    m = 4.0 * args.layers * (args.width + 1) * args.width    # the model's float32 bytes
    # check=False: no same-call check records (a debugging aid NCCL does not send), so the
    # link carries the collectives' bytes only
    with World(4, node_size=2, link_gbps=args.fast_gbps, inter_node_gbps=args.slow_gbps,
               timeout=60.0, run_timeout=600.0, check=False) as linked, \
            World(4, node_size=2, timeout=60.0, run_timeout=600.0, check=False) as unlinked:
        for _ in range(args.repeats):          # alternating, so both see the same load
            results, compute = {}, {}
            for how in RUNS:
                compute[how] = summarise(unlinked.run(run_rank, args, how))["step_s"]
                results[how] = summarise(linked.run(run_rank, args, how))
            rounds.append((results, compute))
    print(f"2 islands x 2 ranks: {args.fast_gbps:g} GB/s inside, {args.slow_gbps:g} GB/s "
          f"between; {args.layers} x Linear({args.width}) float32 ({m / 1e6:.2f} MB), batch "
          f"{args.batch} per rank, {args.steps} steps measured after {args.warmup}; "
          f"H = {args.sync_every}, F = 2; the median of {args.repeats} rounds\n")
    report(rounds, m, args)


if __name__ == "__main__":
    main()
