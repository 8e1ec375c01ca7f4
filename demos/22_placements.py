"""Demo 22: placements. Megatron's f and g, and FSDP's gathers, as changes of placement.

Two models, each step run under CommDebugMode, which counts the collectives that
DTensor's redistribute issues (minidist/distributed/tensor/debug/):

1. an MLP made tensor-parallel by a plan, {"c_fc": ColwiseParallel(),
   "c_proj": RowwiseParallel()}: one all-reduce forward (g: the row layer's
   Partial output to Replicate) and one backward (f: the column layer's input
   gradient, a Partial summand per rank, to Replicate);
2. a GPT under fully_shard (each block a unit, then the root): per step each
   unit's parameters are all-gathered in forward (Shard(0) -> Replicate, one
   collective for all of them), again in backward for the recompute
   (reshard_after_forward=True), and their gradients reduce-scattered
   (Partial(avg) -> Shard(0)).

Then visualize_sharding shows which rank holds which block of the MLP's c_fc weight,
and

3. a GPT under gpt_tp_plan (attention with c_attn cut head by head, the MLP, the
   embedding and head by vocabulary): two all-reduces per block each way, f and g
   of attention and of the MLP.

    python demos/22_placements.py              # 2 processes, a few seconds
    python demos/22_placements.py -n 4 --n-layer 2

The check: both equal one process (max difference <= 1e-12, float64) and the counts
equal the formula. With --figure PATH it draws the counts (needs matplotlib).
"""
import argparse
import copy
import sys

import numpy as np

import minidist
from minidist import backend
from minidist.backend import from_host, to_host
from _args import positive_int
from _launched import one_process_only


def tp_mlp(width):
    """Each rank: the dense MLP and its parallelized copy on the same input; the counts."""
    from minidist.autograd import Tensor
    from minidist.distributed import get_world_size
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.debug import CommDebugMode, sharding_text
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module, parameter_as_dtensor)
    from minidist.nn import MLP
    from minidist import backend
    t = get_world_size()
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    dense = MLP(width, 4 * width, 0.0, True, "float64", generator=backend.Generator(0))
    model = copy.deepcopy(dense)
    parallelize_module(model, mesh["tp"], {"c_fc": ColwiseParallel(),
                                           "c_proj": RowwiseParallel()})
    rng = np.random.default_rng(1)
    x_host, dy = rng.standard_normal((2, 4, width)), rng.standard_normal((2, 4, width))
    outputs = []
    for m in (dense, model):
        x = Tensor(from_host(x_host), requires_grad=True)
        with CommDebugMode() as comm:
            y = m(x)
            y.backward(from_host(dy))
        outputs.append((to_host(y.data), to_host(x.grad)))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(*outputs))
    text = sharding_text(parameter_as_dtensor(model.c_fc, "weight"),
                         header="c_fc.weight (4C, C) as [Shard(0)], visualize_sharding:")
    return diff, comm.get_phase_counts(), text


def fsdp_gpt(n_layer, n_embd):
    """Each rank: a GPT step under fully_shard on its micro-batch, one process on all."""
    from minidist.distributed import get_rank, get_world_size
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    n, r = get_world_size(), get_rank()
    cfg = GPTConfig(block_size=16, vocab_size=32, n_layer=n_layer, n_head=2, n_embd=n_embd,
                    dtype="float64")
    single, model = GPT(cfg), GPT(cfg)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    rng = np.random.default_rng(2)
    idx, tgt = rng.integers(0, 32, (2 * n, 16)), rng.integers(0, 32, (2 * n, 16))
    opt_single, opt = AdamW(single.parameters(), lr=1e-2), AdamW(model.parameters(), lr=1e-2)
    _, loss = single(from_host(idx), from_host(tgt))
    loss.backward()
    opt_single.step()
    with CommDebugMode() as comm:
        _, loss = model(from_host(idx[2 * r:2 * r + 2]), from_host(tgt[2 * r:2 * r + 2]))
        loss.backward()
    opt.step()
    theirs = dict(single.named_parameters())
    diff = max(float(np.abs(to_host(d.full_tensor().data) - to_host(theirs[k].data)).max())
               for k, d in sharded_state_dict(model).items())
    params = len({id(p) for p in single.parameters()})
    return diff, comm.get_phase_counts(), params


def tp_gpt(n_layer, n_embd):
    """Each rank: a GPT step under gpt_tp_plan (attention cut head by head, MLP,
    vocabulary-parallel embedding and head), one process beside it."""
    from minidist.distributed import get_world_size
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import DTensor
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import gpt_tp_plan, parallelize_module
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    t = get_world_size()
    cfg = GPTConfig(block_size=16, vocab_size=8 * t, n_layer=n_layer, n_head=t, n_embd=n_embd,
                    dtype="float64")
    single, model = GPT(cfg), GPT(cfg)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh["tp"], gpt_tp_plan(cfg, t))
    rng = np.random.default_rng(3)
    idx, tgt = (from_host(rng.integers(0, cfg.vocab_size, (2, 16))) for _ in range(2))
    for m in (single, model):
        opt = AdamW(m.parameters(), lr=1e-2)
        with CommDebugMode() as comm:
            _, loss = m(idx, tgt)
            loss.backward()
        opt.step()
    theirs = single.state_dict()
    diff = 0.0
    for name, value in model.state_dict().items():    # DTensors: each rank's pieces
        full = value.full_tensor().data if isinstance(value, DTensor) else value
        full = to_host(full).reshape(theirs[name].shape)   # c_attn: (3, C, C) -> (3C, C)
        diff = max(diff, float(np.abs(full - to_host(theirs[name])).max()))
    return diff, comm.get_phase_counts()


def show(title, counts):
    print(title)
    for phase in ("forward", "backward"):
        calls = ", ".join(f"{k} x{v}" for k, v in sorted(counts[phase].items())) or "none"
        print(f"  {phase:<9} {calls}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", "--world-size", type=positive_int, default=2)
    p.add_argument("--width", type=positive_int, default=8, help="the MLP's width C")
    p.add_argument("--n-layer", type=positive_int, default=1)
    p.add_argument("--n-embd", type=positive_int, default=16)
    p.add_argument("--figure", metavar="PATH")
    args = p.parse_args()
    one_process_only("it starts its own worlds and compares each with one process")
    n = args.world_size
    if args.width % n or (4 * args.width) % n:
        p.error(f"-n ({n}) must divide --width ({args.width}) for the tensor-parallel MLP")
    if args.n_embd % 2 or args.n_embd % n:
        p.error(f"--n-embd ({args.n_embd}) must be even (2 heads) and divisible by -n ({n}): "
                f"the tensor-parallel GPT has one head per rank")
    print(f"{n} processes, float64; the collectives each step issues (CommDebugMode)\n")
    tp = minidist.launch(tp_mlp, n, args.width)
    diff_tp, counts_tp, picture = tp[0]
    show(f"1. MLP, parallelize_module(ColwiseParallel, RowwiseParallel) over {n} ranks:",
         counts_tp)
    print("   forward all_reduce = g (Partial -> Replicate), backward all_reduce = f\n")
    print(picture + "\n")
    fs = minidist.launch(fsdp_gpt, n, args.n_layer, args.n_embd)
    diff_fs, counts_fs, params = fs[0]
    show(f"2. GPT ({args.n_layer} blocks, {params} parameters) under fully_shard over "
         f"{n} ranks:", counts_fs)
    units = args.n_layer + 1
    print(f"   one all-gather per unit ({args.n_layer} blocks + the root) forward, one per block "
          f"backward (the recompute); one reduce-scatter per unit\n")
    want_tp = ({"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}} if n > 1
               else {"forward": {}, "backward": {}})
    want_fs = ({"forward": {"all_gather_into_tensor": units},
                "backward": {"all_gather_into_tensor": args.n_layer,
                             "reduce_scatter_tensor": units}}
               if n > 1 else {"forward": {}, "backward": {}})
    gpt = minidist.launch(tp_gpt, n, args.n_layer, args.n_embd)
    counts_gpt = gpt[0][1]
    L = args.n_layer
    show(f"3. GPT ({L} blocks, {n} heads) under gpt_tp_plan over {n} ranks (attention head "
         f"by head, MLP, embedding and head by vocabulary):", counts_gpt)
    print(f"   2 all-reduces per block each way (attention's and the MLP's g, then f), + the "
          f"embedding's sum and the head's f; the logits all-gathered\n")
    want_gpt = ({"forward": {"all_reduce": 2 * L + 1, "all_gather_into_tensor": 1},
                 "backward": {"all_reduce": 2 * L + 1}} if n > 1
                else {"forward": {}, "backward": {}})
    worst = max(max(r[0] for r in tp), max(r[0] for r in fs), max(r[0] for r in gpt))
    counts_ok = counts_tp == want_tp and counts_fs == want_fs and counts_gpt == want_gpt
    ok = worst <= 1e-12 and counts_ok
    print(f"check: max |parallel - single process| = {worst:.1e} (tolerance 1e-12), counts "
          f"{'equal' if counts_ok else 'DIFFER FROM'} the formula: {'ok' if ok else 'FAILED'}")
    if args.figure:
        from _figures import placements_counts
        placements_counts(args.figure, {"TP MLP": counts_tp, "FSDP GPT step": counts_fs})
    return 0 if ok else 1


if __name__ == "__main__":   # the ranks are spawned: they import this file, not run it
    sys.exit(main())
