"""minidist on CuPy vs PyTorch on the same GPU: GPT step, flash attention, all-reduce.

    python bench/bench_gpu.py                        # all three, default sizes
    python bench/bench_gpu.py --lengths 1024 4096 --steps 20 --sizes 1M 64M

In one run, on one GPU, each beside its PyTorch counterpart (eager, CUDA):

1. a GPT training step (forward + backward + AdamW, float32): minidist.nn.GPT
   on CuPy vs its PyTorch twin (tests/oracles/torch_gpt.py) with identical
   weights and batch; the model sizes of bench_autograd.py; median step time.
   Target: minidist <= 1.5x torch eager.
2. causal attention forward + backward at each ``--lengths`` s: minidist's
   flash_attention on CuPy vs torch.nn.functional.scaled_dot_product_attention
   (is_causal=True: PyTorch's fused kernel). Target at s=4096: <= 3x.
3. an all-reduce of float32 device arrays between 2 ranks (processes started
   with spawn; with one GPU both share it): minidist.launch world on CuPy (each
   message staged through host shared memory) vs torch.distributed, NCCL when
   each rank has a GPU of its own, gloo (CUDA tensors) when they share one,
   since NCCL refuses two ranks on one device. The backend used is printed.

Steps alternate between the two frameworks so that noise hits both alike.
Without CuPy, a CUDA device, or PyTorch built with CUDA the script says so in
one line and exits with status 2. docs/gpu.md records the figures.
"""
import argparse
import os
import socket
import statistics
import sys
import time

import gpt_race
from _args import byte_size, positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=positive_int, default=15, help="timed GPT steps per framework")
gpt_race.add_gpt_size_arguments(parser)  # the same GPT as bench_autograd.py
parser.add_argument("--lengths", type=positive_int, nargs="+", default=[1024, 4096],
                    help="attention sequence lengths")
parser.add_argument("--heads", type=positive_int, default=8,
                    help="attention heads (batch 1, d = --d)")
parser.add_argument("--d", type=positive_int, default=64, help="attention head dim")
parser.add_argument("--block-q", type=positive_int, default=None,
                    help="flash tile rows (default: op's)")
parser.add_argument("--block-k", type=positive_int, default=None,
                    help="flash tile cols (default: op's)")
parser.add_argument("--repeats", type=positive_int, default=5,
                    help="timed attention / all-reduce runs")
parser.add_argument("--sizes", type=byte_size, nargs="+",
                    default=[1 << 20, 16 << 20, 64 << 20],
                    help="all-reduce message sizes in bytes (K, M suffixes)")
args = parser.parse_args()
gpt_race.check_gpt_size(parser, args)

# The backend is chosen below, once we know CuPy can run: importing minidist with
# MINIDIST_BACKEND=cupy on a machine without it would stop with a traceback.
os.environ.pop("MINIDIST_BACKEND", None)
from minidist import backend  # noqa: E402


def unavailable() -> str | None:
    """Why this benchmark cannot run here, or None."""
    problem = backend.cupy_unavailable()
    if problem:
        return problem
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install torch, a CUDA build) as the reference"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} has no CUDA device (a CPU-only build?)"
    return None


problem = unavailable()
if problem:
    print(f"bench_gpu: needs CuPy, a CUDA device and PyTorch with CUDA: {problem}",
          file=sys.stderr)
    sys.exit(2)

import cupy  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

backend.set_backend("cupy")
os.environ["MINIDIST_BACKEND"] = "cupy"  # spawned ranks start on it too

import minidist.distributed as dist  # noqa: E402
from minidist.attention import flash_attention  # noqa: E402
from minidist.autograd import Tensor  # noqa: E402
from minidist.comm import World  # noqa: E402

CUDA = torch.device("cuda", cupy.cuda.Device().id)  # the device minidist uses, too


def sync() -> None:
    backend.synchronize()
    torch.cuda.synchronize(CUDA)


def timed(step) -> float:
    sync()
    start = time.perf_counter()
    step()
    sync()
    return time.perf_counter() - start


def medians(steps: dict, repeats: int) -> dict:
    """Median seconds of each step, alternating between them ``repeats`` times."""
    for step in steps.values():  # warm up: kernels compiled, pools filled
        step(), step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(timed(step))
    return {name: statistics.median(ts) for name, ts in times.items()}


def verdict(ratio: float, target: float) -> str:
    return f"(target <= {target:g}x{'' if ratio <= target else ', MISSED'})"


# -- 1. GPT training step --------------------------------------------------------------

def gpt_step() -> float:
    model, minidist_step, torch_step = gpt_race.build(args, CUDA)
    cfg = model.config
    med = medians({"minidist": minidist_step, "torch": torch_step}, args.steps)
    tokens = args.batch * args.block
    print(f"\n1. GPT training step: {cfg.n_layer} layers, width {cfg.n_embd}, {cfg.n_head} heads, "
          f"batch {args.batch} x {args.block}, {model.num_parameters():,} params, float32")
    print(f"   {'framework':<10} {'median ms':>10} {'tokens/s':>10}")
    for name, t in med.items():
        print(f"   {name:<10} {1e3 * t:10.2f} {tokens / t:10.0f}")
    ratio = med["minidist"] / med["torch"]
    print(f"   ratio minidist / torch eager: {ratio:.2f}x {verdict(ratio, 1.5)}")
    return ratio


# -- 2. flash attention forward + backward -------------------------------------------

def attention() -> dict:
    blocks = {k: v for k, v in (("block_q", args.block_q), ("block_k", args.block_k)) if v}
    print(f"\n2. causal attention forward + backward: batch 1 x {args.heads} heads, "
          f"d = {args.d}, float32; minidist flash {blocks or '(default tiles)'} vs torch SDPA")
    print(f"   {'s':>6} {'minidist ms':>12} {'torch ms':>9} {'ratio':>7}")
    ratios = {}
    for s in args.lengths:
        rng = np.random.default_rng(s)
        host = [rng.standard_normal((1, args.heads, s, args.d)).astype("float32")
                for _ in range(4)]
        arrays = [backend.from_host(a) for a in host]
        tensors = [torch.from_numpy(a).to(CUDA) for a in host]

        def minidist_step():
            q, k, v = (Tensor(a, requires_grad=True) for a in arrays[:3])
            flash_attention(q, k, v, is_causal=True, **blocks).backward(arrays[3])

        def torch_step():
            q, k, v = (t.clone().requires_grad_() for t in tensors[:3])
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(tensors[3])

        med = medians({"minidist": minidist_step, "torch": torch_step}, args.repeats)
        ratios[s] = med["minidist"] / med["torch"]
        print(f"   {s:>6} {1e3 * med['minidist']:>12.2f} {1e3 * med['torch']:>9.2f} "
              f"{ratios[s]:>6.2f}x", flush=True)
    if 4096 in ratios:
        print(f"   ratio at s=4096: {ratios[4096]:.2f}x {verdict(ratios[4096], 3)}")
    return ratios


# -- 3. all-reduce between 2 ranks ---------------------------------------------------------

def all_reduce_times(sizes: list, repeats: int, port: int, torch_backend: str) -> dict:
    """On each rank: median seconds of minidist's and torch's all-reduce per size."""
    import torch.distributed as tdist
    rank = dist.get_rank()
    device = torch.device("cuda", backend.current_device())  # launch's choice: GPU rank mod G
    tdist.init_process_group(torch_backend, init_method=f"tcp://127.0.0.1:{port}",
                             rank=rank, world_size=2)
    results = {}
    for nbytes in sizes:
        x = backend.xp.ones(nbytes // 4, dtype="float32")
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        steps = {"minidist": lambda: dist.all_reduce(x),
                 "torch": lambda: tdist.all_reduce(t)}
        times = {name: [] for name in steps}
        for _ in range(2 + repeats):  # the first two warm up
            for name, step in steps.items():
                dist.barrier()
                backend.synchronize()
                torch.cuda.synchronize(device)
                start = time.perf_counter()
                step()
                backend.synchronize()
                torch.cuda.synchronize(device)
                times[name].append(time.perf_counter() - start)
        results[nbytes] = {name: statistics.median(ts[2:]) for name, ts in times.items()}
    tdist.destroy_process_group()
    return results


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_reduce() -> dict:
    gpus = torch.cuda.device_count()
    if gpus >= 2 and torch.distributed.is_nccl_available():
        torch_backend, why = "nccl", "each rank on its own GPU"
    else:
        torch_backend = "gloo"
        why = ("both ranks share GPU 0 and NCCL refuses two ranks on one device" if gpus < 2
               else "this PyTorch has no NCCL")
    sizes = args.sizes
    with World(2) as world:
        per_rank = world.run(all_reduce_times, sizes, args.repeats, free_port(), torch_backend)
    print(f"\n3. all-reduce of float32 device arrays, 2 ranks on {gpus} GPU(s); torch.distributed "
          f"backend {torch_backend} ({why}); the slower rank's median")
    print(f"   {'size':>8} {'minidist ms':>12} {'torch ms':>9} {'ratio':>7} "
          f"{'minidist busbw GB/s':>20}")
    ratios = {}
    for nbytes in sizes:
        t_md = max(r[nbytes]["minidist"] for r in per_rank)
        t_torch = max(r[nbytes]["torch"] for r in per_rank)
        ratios[nbytes] = t_md / t_torch
        busbw = nbytes / t_md / 1e9  # 2(N-1)/N = 1 for N = 2
        print(f"   {size_text(nbytes):>8} {1e3 * t_md:>12.2f} {1e3 * t_torch:>9.2f} "
              f"{ratios[nbytes]:>6.2f}x {busbw:>20.2f}")
    return ratios


if __name__ == "__main__":
    print(f"GPU: {torch.cuda.get_device_name(CUDA)}; CuPy {cupy.__version__}, "
          f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}")
    gpt = gpt_step()
    flash = attention()
    comm = all_reduce()
    print("\nsummary (minidist / torch, time):")
    print(f"   GPT step            {gpt:.2f}x {verdict(gpt, 1.5)}")
    for s, r in flash.items():
        print(f"   flash s={s:<11}{r:.2f}x" + (f" {verdict(r, 3)}" if s == 4096 else ""))
    for nbytes, r in comm.items():
        print(f"   all-reduce {size_text(nbytes):<8} {r:.2f}x")
