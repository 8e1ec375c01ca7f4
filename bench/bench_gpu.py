"""minidist on CuPy vs PyTorch on the same GPU: GPT and Llama steps, flash attention,
all-reduce, block-scaled quantisation.

    python bench/bench_gpu.py                        # everything, default sizes
    python bench/bench_gpu.py --parts gpt attention --lengths 1024 4096 --steps 20
    python bench/bench_gpu.py --parts allreduce --sizes 1M 64M

In one run, on one GPU, each beside its PyTorch counterpart (eager, CUDA):

1. a GPT training step (forward + backward + AdamW, float32): minidist.nn.GPT
   on CuPy vs its PyTorch twin (tests/oracles/torch_gpt.py) with identical
   weights and batch; the model sizes of bench_autograd.py; median step time;
   then the same for the Llama (minidist.nn.Llama vs transformers'
   LlamaForCausalLM with its weights). Target: minidist <= 1.5x torch eager.
   Where the time goes: PyTorch's profiler (CUPTI) sees every kernel the
   process launches, CuPy's too, so one profiled step of each framework gives
   its kernel count and the device's busy time; the rest of the step is host
   time (Python, the launches themselves).
2. causal attention forward + backward at each ``--lengths`` s: minidist's
   flash_attention on CuPy vs torch.nn.functional.scaled_dot_product_attention
   (is_causal=True: PyTorch's fused kernel). Target at s=4096: <= 3x.
3. an all-reduce of float32 device arrays between 2 ranks (processes started
   with spawn; with one GPU both share it): minidist.launch world on CuPy (each
   message staged through host shared memory) vs torch.distributed, NCCL when
   each rank has a GPU of its own, gloo (CUDA tensors) when they share one,
   since NCCL refuses two ranks on one device. The backend used is printed.
4. MX (E4M3, E2M1) and NVFP4 quantisation of --quant-n float32 values in
   blocks of 32 / 16: minidist's mx_quantize / nvfp4_quantize on CuPy vs
   torchao's to_mx / nvfp4_quantize on the same GPU, where torchao imports.
   minidist returns the element values as float32, torchao packed codes: the
   same rounding, different output bytes.

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
PARTS = ("gpt", "llama", "attention", "allreduce", "quant")
parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                    help="which measurements to run (default: all)")
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
parser.add_argument("--quant-n", type=positive_int, default=1 << 24,
                    help="values quantised per MX / NVFP4 run (a multiple of 32)")
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
from minidist.optim import fused_adam  # noqa: E402

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


# -- 1. GPT and Llama training steps --------------------------------------------------

def training_step(kind: str) -> float:
    """minidist / torch median step time for ``kind`` ("gpt" or "llama"), printed with
    where the time goes."""
    model, minidist_step, torch_step = gpt_race.build(argparse.Namespace(**{**vars(args),
                                                                           "model": kind}), CUDA)
    def chain_optimizer_step():            # adam.py's chain, fourteen launches a parameter
        fused_adam.ENABLED = False
        try:
            minidist_step()
        finally:
            fused_adam.ENABLED = True
    med = medians({"minidist": minidist_step, "unfused": chain_optimizer_step,
                   "torch": torch_step}, args.steps)
    tokens = args.batch * args.block
    name = "Llama" if kind == "llama" else "GPT"
    print(f"\n1. {name} training step: {args.n_layer} layers, width {args.n_embd}, "
          f"{args.n_head} heads, batch {args.batch} x {args.block}, "
          f"{model.num_parameters():,} params, float32")
    print(f"   {'framework':<10} {'median ms':>10} {'tokens/s':>10} {'kernels':>8} "
          f"{'device busy ms':>15}")
    for framework, step in (("minidist", minidist_step), ("unfused", chain_optimizer_step),
                            ("torch", torch_step)):
        kernels, busy = kernel_profile(step)
        print(f"   {framework:<10} {1e3 * med[framework]:10.2f} {tokens / med[framework]:10.0f} "
              f"{kernels:>8} {busy:>15}")
    ratio = med["minidist"] / med["torch"]
    print(f"   ratio minidist / torch eager: {ratio:.2f}x {verdict(ratio, 1.5)}; the fused AdamW "
          f"kernel against adam.py's chain: {med['unfused'] / med['minidist']:.2f}x faster")
    return ratio


def kernel_profile(step) -> tuple[str, str]:
    """(kernels launched, device busy ms) in one profiled ``step``: PyTorch's profiler
    records every CUDA kernel of the process through CUPTI, CuPy's included."""
    try:
        from torch.profiler import ProfilerActivity, profile
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        busy_us = sum(e.device_time for e in kernels)
        return str(len(kernels)), f"{busy_us / 1e3:.2f}"
    except Exception as exc:  # a profiler that cannot start here: say so, time anyway
        return "?", f"({type(exc).__name__})"


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


# -- 4. MX / NVFP4 quantisation -------------------------------------------------------

def quantisation() -> dict:
    """Median seconds of minidist's and torchao's block quantisation of the same values."""
    from minidist.precision import mx_quantize, nvfp4_quantize
    host = np.random.default_rng(0).standard_normal(args.quant_n).astype("float32")
    x = backend.from_host(host.reshape(-1, 1024))
    tx = torch.from_numpy(host.reshape(-1, 1024)).to(CUDA)
    try:
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize as ao_nvfp4
        from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale
        ao = {"mxfp8 e4m3": lambda: to_mx(tx, torch.float8_e4m3fn, 32),
              "mxfp4 e2m1": lambda: to_mx(tx, torch.float4_e2m1fn_x2, 32),
              "nvfp4": lambda: ao_nvfp4(tx, 16, per_tensor_amax_to_scale(tx.abs().max()))}
        why = ""
    except Exception as exc:  # torchao absent, or built for another PyTorch
        ao, why = {}, f"torchao does not run here ({type(exc).__name__}: {exc})"
    ours = {"mxfp8 e4m3": lambda: mx_quantize(x, "fp8_e4m3fn"),
            "mxfp4 e2m1": lambda: mx_quantize(x, "fp4_e2m1fn"),
            "nvfp4": lambda: nvfp4_quantize(x)}
    print(f"\n4. block quantisation of {args.quant_n:,} float32 values (rows of 1024), "
          f"median of {args.repeats}; minidist returns float32 values, torchao packed codes")
    if why:
        print(f"   {why}")
    print(f"   {'format':<11} {'minidist ms':>12} {'Gelem/s':>8} {'torchao ms':>11} {'ratio':>7}")
    ratios = {}
    for fmt, step in ours.items():
        steps = {"minidist": step, **({"torchao": ao[fmt]} if fmt in ao else {})}
        med = medians(steps, args.repeats)
        rate = args.quant_n / med["minidist"] / 1e9
        if "torchao" in med:
            ratios[fmt] = med["minidist"] / med["torchao"]
            ref = f"{1e3 * med['torchao']:>11.2f} {ratios[fmt]:>6.2f}x"
        else:
            ref = f"{'-':>11} {'-':>7}"
        print(f"   {fmt:<11} {1e3 * med['minidist']:>12.2f} {rate:>8.2f} {ref}", flush=True)
    return ratios


if __name__ == "__main__":
    print(f"GPU: {torch.cuda.get_device_name(CUDA)}; CuPy {cupy.__version__}, "
          f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}")
    steps = {kind: training_step(kind) for kind in ("gpt", "llama") if kind in args.parts}
    flash = attention() if "attention" in args.parts else {}
    comm = all_reduce() if "allreduce" in args.parts else {}
    quant = quantisation() if "quant" in args.parts else {}
    print("\nsummary (minidist / torch, time):")
    for kind, r in steps.items():
        label = "GPT step" if kind == "gpt" else "Llama step"
        print(f"   {label:<19} {r:.2f}x {verdict(r, 1.5)}")
    for s, r in flash.items():
        print(f"   flash s={s:<11} {r:.2f}x" + (f" {verdict(r, 3)}" if s == 4096 else ""))
    for nbytes, r in comm.items():
        print(f"   all-reduce {size_text(nbytes):<8} {r:.2f}x")
    for fmt, r in quant.items():
        print(f"   {fmt:<19} {r:.2f}x (vs torchao)")
