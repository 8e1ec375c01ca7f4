"""Demo 12: a sharded ZeRO checkpoint, saved on 4 processes, resumed on 4, 2 and 3.

Four ranks train an MLP with ZeRO-2 (AdamW, clipping) for a few steps, and each
writes its shard of the weights and of Adam's moments (save_sharded: shard
files of .npy records and JSON -- data only, nothing is unpickled on load --, a
manifest with their sizes and sha256s, then LATEST, atomically). A
fresh world -- of 4, 2 or 3 ranks, each model built from other random weights
so that loading must do the work -- loads the checkpoint (load_sharded cuts the
flat vectors again for the new world size) and trains on. Every rank sees the
same global batch of 12 rows per step whatever the world size, so the resumed
runs must end where the uninterrupted one does:

    same world size: bit for bit;  another: within 1e-12 (float64; the sums over
    ranks are added in another order)

    python demos/12_checkpoints.py                  # ~5 s
    python demos/12_checkpoints.py --steps 10 --save-at 3
    python demos/12_checkpoints.py --figure /tmp/checkpoints.png

With --figure PATH (no figure without it) it saves the loss per step of each
run and the bytes of each shard file as a PNG (needs matplotlib).
Code: minidist/checkpoint/sharded.py (save, load, reshard), io.py (atomic writes),
records.py and tree.py (the file format).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import zipfile

import numpy as np

from minidist.comm import World
from _args import non_negative_int, positive_int
from _launched import one_process_only

GLOBAL_BATCH = 12          # divisible by 4, 3 and 2: equal rows per rank at every size


def run(directory, width, start, stop, save):
    """One rank: build, load if resuming, train steps [start, stop), save if asked."""
    from minidist.autograd import Tensor
    from minidist.backend import Generator, from_host, to_host
    from minidist.checkpoint import load_sharded, save_sharded
    from minidist.distributed import get_rank, get_world_size
    from minidist.nn import MLP
    from minidist.optim import AdamW
    from minidist.parallel import Zero2
    rank, n = get_rank(), get_world_size()
    model = MLP(width, 2 * width, dtype="float64", generator=Generator(100 + start))
    zero = Zero2(model, AdamW, lr=1e-2, max_grad_norm=0.5)
    if start > 0:
        load_sharded(directory, zero)
    losses, rows = [], GLOBAL_BATCH // n
    for step in range(start, stop):
        data = np.random.default_rng(step).standard_normal((2, GLOBAL_BATCH, width))
        x, y = (from_host(a[rank * rows:(rank + 1) * rows]) for a in data)  # my rows
        diff = zero(Tensor(x)) - Tensor(y)
        loss = (diff * diff).mean()
        loss.backward()
        zero.step()
        zero.zero_grad()
        losses.append(float(loss.data))
    if save:
        save_sharded(directory, zero)
    return {k: to_host(p.data).copy() for k, p in model.named_parameters()}, losses


def mean_losses(results):
    """The loss of each step: the mean over ranks (each has as many rows)."""
    return list(np.mean([r[1] for r in results], axis=0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=positive_int, default=32, help="MLP(width, 2 * width)")
    parser.add_argument("--steps", type=positive_int, default=8, help="steps of the whole run")
    parser.add_argument("--save-at", type=non_negative_int, default=4,
                        help="the step the checkpoint is taken")
    parser.add_argument("--figure", metavar="PATH", help="save a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts worlds of 4, 2 and 3 ranks to save a checkpoint and reshard it")
    k, steps = args.save_at, args.steps
    if k >= steps:
        parser.error(f"--save-at ({k}) must be a step below --steps ({steps})")
    directory = tempfile.mkdtemp(prefix="minidist_ckpt_")       # removed at the end

    with World(4) as world:
        straight = world.run(run, None, args.width, 0, steps, False)
        world.run(run, directory, args.width, 0, k, True)
    latest = open(os.path.join(directory, "LATEST")).read().strip()
    manifest = json.load(open(os.path.join(directory, latest, "manifest.json")))
    print(f"ZeRO-2 on 4 ranks, {k} steps, saved to {directory}/{latest}:")
    for f in manifest["files"]:
        print(f"  {f['name']}  {f['bytes']:>7,} bytes  sha256 {f['sha256'][:16]}...")
    first = os.path.join(directory, latest, manifest["files"][0]["name"])
    with zipfile.ZipFile(first) as archive:        # data only: .npy records and JSON
        index = json.loads(archive.read("checkpoint.json"))
    print(f"{manifest['files'][0]['name']} holds checkpoint.json (the structure) and "
          f"{len(index['records'])} .npy records, e.g.")
    for r in index["records"][:3]:
        print(f"  {r['name']:<36} {r['dtype']} {r['shape']}")

    want, ok, resumed = straight[0][0], True, {}
    print(f"\nresumed at step {k}, trained to step {steps}; compared with one "
          f"uninterrupted run on 4 ranks")
    for n in (4, 2, 3):
        with World(n) as world:
            results = world.run(run, directory, args.width, k, steps, False)
        diff = max(float(np.abs(r[0][name] - want[name]).max()) for r in results for name in want)
        good = diff == 0.0 if n == 4 else diff <= 1e-12
        ok &= good
        resumed[n] = mean_losses(results)
        print(f"  on {n} ranks: max |resumed - uninterrupted| = {diff:.1e}  "
              f"({'bitwise' if n == 4 else 'tolerance 1e-12'}) {'ok' if good else 'FAILED'}")
    if args.figure:
        from _figures import checkpoint_resume
        checkpoint_resume(args.figure, mean_losses(straight), resumed, k,
                          [f["bytes"] for f in manifest["files"]])
    shutil.rmtree(directory)
    print(f"\ncheck: resumed runs equal the uninterrupted one (same size bitwise, 2 and 3 "
          f"ranks within 1e-12): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":   # the ranks are spawned: they import this file, not run it
    sys.exit(main())
