"""PyTorch's own DTensor as the oracle: the same cases on a gloo world of CPU processes.

``run(n, fn_name, cases)`` starts n processes (torch.multiprocessing, a FileStore
in a temporary folder), each calls ``init_device_mesh("cpu", ...)`` per case and
runs ``CASES[fn_name]`` on it; the per-rank results come back through files.
Torch starts once per call (seconds: each process imports torch), so a test sends
all its cases in one batch, and ``run_batches`` serves several tests' batches at once.
"""
import os
import pickle
import tempfile

import numpy as np


def _placements(spec):
    from torch.distributed.tensor import Partial, Replicate, Shard
    return [Shard(p[1]) if p[0] == "S" else Partial(p[1]) if p[0] == "P" else Replicate()
            for p in spec]


def _distribute(full, mesh, spec):
    """A DTensor of ``full`` placed as ``spec``. Every rank holds the whole case, so each
    takes its own piece (``src_data_rank=None``) instead of a scatter or broadcast from
    rank 0: the same pieces, two collectives fewer per case."""
    import torch
    from torch.distributed.tensor import distribute_tensor
    return distribute_tensor(torch.from_numpy(np.array(full)), mesh, _placements(spec),
                             src_data_rank=None)


_MESHES = {}


def _mesh(shape):
    """One mesh per shape for the whole batch (gloo builds its groups slowly)."""
    from torch.distributed.device_mesh import init_device_mesh
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def redistribute(case):
    """distribute as src, redistribute to dst: (local piece, placements as text)."""
    mesh = _mesh(tuple(case["mesh"]))
    x = _distribute(case["full"], mesh, case["src"])
    try:
        y = x.redistribute(mesh, _placements(case["dst"]))
    except Exception as e:  # noqa: BLE001 (torch refuses some pairs: reported, not compared)
        return ("refused", type(e).__name__)
    return (y.to_local().numpy().copy(), [repr(p) for p in y.placements])


def op(case):
    """The op of tests/distributed/test_ops.py on torch's DTensors: (full output,
    output placements as text)."""
    import torch
    mesh = _mesh(tuple(case["mesh"]))
    xs = [_distribute(full, mesh, spec) for full, spec in zip(case["inputs"], case["placements"])]
    try:
        if case["op"] == "matmul":
            out = xs[0] @ xs[1]
        elif case["op"] == "sum":
            out = xs[0].sum(case["dim"])
        else:
            fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}[case["op"]]
            out = fn(xs[0], xs[1])
    except Exception as e:  # noqa: BLE001 (torch refuses some pairs: reported, not compared)
        return ("refused", type(e).__name__)
    return (out.full_tensor().numpy().copy(), [repr(p) for p in out.placements])


def _torch_rule(case, xs):
    """The op of tests/distributed/test_propagation_rules.py in torch's words."""
    import torch
    import torch.nn.functional as F
    op, arg = case["op"], case["arg"]
    if op == "mean":
        return xs[0].mean() if arg is None else xs[0].mean(dim=arg)
    if op in ("mean_keepdim", "sum_keepdim"):
        fn = xs[0].mean if op == "mean_keepdim" else xs[0].sum
        return fn(dim=arg, keepdim=True)
    if op in ("softmax", "log_softmax"):
        return getattr(torch, op)(xs[0], arg)
    if op == "layer_norm":
        return F.layer_norm(xs[0], (xs[0].shape[-1],), xs[1], xs[2], eps=1e-5)
    if op == "rms_norm":
        return F.rms_norm(xs[0], (xs[0].shape[-1],), xs[1], eps=1e-6)
    if op == "embedding":
        return F.embedding(xs[1], xs[0])
    if op == "reshape":
        return xs[0].reshape(arg)
    if op == "transpose":
        return xs[0].transpose(*arg)
    return xs[0].permute(*arg)


def rule(case):
    """A propagated op of test_propagation_rules.py on torch's DTensors: (full output,
    output placements as text; torch's _MaskPartial, an embedding's Partial sum, as
    Partial(sum))."""
    mesh = _mesh(tuple(case["mesh"]))
    xs = [_distribute(full, mesh, spec) for full, spec in zip(case["inputs"], case["placements"])]
    try:
        out = _torch_rule(case, xs)
        full = out.full_tensor().numpy().copy()
    except Exception as e:  # noqa: BLE001 (torch refuses some cases: reported, not compared)
        return ("refused", f"{type(e).__name__}: {e}"[:300])
    names = ["Partial(sum)" if repr(p).startswith("_MaskPartial") else repr(p)
             for p in out.placements]
    return (full, names)


# torch's c10d op names in CommDebugMode -> minidist's
_COMM_NAMES = {"c10d._allgather_base_": "all_gather_into_tensor",
               "c10d._reduce_scatter_base_": "reduce_scatter_tensor",
               "c10d.allreduce_": "all_reduce"}


def fsdp(case):
    """fully_shard over ``case["mesh"]`` (dim 0 replicates on a 2-D mesh) on each Linear
    of a Sequential and on the root; ``case["steps"]`` SGD steps on this rank's rows:
    (placements as text, local pieces, CommDebugMode's counts per step, whole parameters)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode
    names = ("dp_replicate", "dp_shard")[-len(case["mesh"]):]
    mesh = init_device_mesh("cpu", tuple(case["mesh"]), mesh_dim_names=names)
    layers = [torch.nn.Linear(w.shape[1], w.shape[0]).double() for w, _ in case["weights"]]
    with torch.no_grad():
        for layer, (w, b) in zip(layers, case["weights"]):
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
    model = torch.nn.Sequential(*layers)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=case["lr"])
    counts = []
    for x in case["inputs"]:
        rows = torch.from_numpy(x[case["rows"][torch.distributed.get_rank()]])
        with CommDebugMode() as comm:
            y = model(rows)
            (y * y).mean().backward()
        counts.append({_COMM_NAMES[str(k)]: v for k, v in comm.get_comm_counts().items()})
        opt.step()
        opt.zero_grad()
    return ({n: [repr(p) for p in t.placements] for n, t in model.named_parameters()},
            {n: t.to_local().detach().numpy().copy() for n, t in model.named_parameters()},
            counts,
            {n: t.full_tensor().detach().numpy().copy() for n, t in model.named_parameters()})


CASES = {"redistribute": redistribute, "op": op, "rule": rule, "fsdp": fsdp}


def _worker(rank, n, folder):
    import torch.distributed as tdist
    with open(os.path.join(folder, "batches.pkl"), "rb") as f:
        batches = pickle.load(f)
    store = tdist.FileStore(os.path.join(folder, "store"), n)
    tdist.init_process_group("gloo", rank=rank, world_size=n, store=store)
    try:
        out = [[CASES[fn_name](case) for case in cases] for fn_name, cases in batches]
        tdist.barrier()   # no rank tears its gloo pairs down while a peer still sends
    finally:
        tdist.destroy_process_group()
    with open(os.path.join(folder, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(out, f)


def run(n, fn_name, cases):
    """Per case, the list of every rank's result."""
    return run_batches(n, [(fn_name, cases)])[0]


def run_batches(n, batches, attempts=2):
    """For each (fn_name, cases) of ``batches``, per case the list of every rank's result,
    from one start of n processes. A gloo process that aborts (torch's own transport,
    seen under heavy load) gets the whole batch one more try."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as folder:
        for attempt in range(attempts):
            for name in os.listdir(folder):   # a fresh store and no stale results
                os.remove(os.path.join(folder, name))
            # the cases go by file: as arguments, a batch larger than a pipe's buffer holds
            # each start until the process before it has read them (a second per rank)
            with open(os.path.join(folder, "batches.pkl"), "wb") as f:
                pickle.dump(batches, f)
            try:
                mp.spawn(_worker, args=(n, folder), nprocs=n, join=True)
                break
            except mp.ProcessExitedException:
                if attempt == attempts - 1:
                    raise
        per_rank = []
        for r in range(n):
            with open(os.path.join(folder, f"rank{r}.pkl"), "rb") as f:
                per_rank.append(pickle.load(f))
    return [[[per_rank[r][b][i] for r in range(n)] for i in range(len(cases))]
            for b, (_, cases) in enumerate(batches)]
