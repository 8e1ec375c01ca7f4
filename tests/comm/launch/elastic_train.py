"""A DDP training script that survives restarts: run by ``minidist run --max-restarts``.

    python -m minidist.cli run -n 2 --max-restarts 2 elastic_train.py DIR [KILLS]

Every step ends with a checkpoint (model, AdamW state, sampler position, RNG)
in DIR/ckpt.npz; a restarted world (``MINIDIST_RESTART_COUNT`` > 0) loads it
and goes on from the step after. KILLS is "attempt:rank:step,...": in that
attempt, that rank kills itself with SIGKILL in the middle of that step (after
the gradients were averaged, before the optimizer step), as a crashing
machine would. At the end rank 0 writes the final weights to DIR/final.npz.
"""
import os
import pathlib
import signal
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the checkout: tests.*
from tests.checkpoint.resume_cases import next_indices  # noqa: E402

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.checkpoint import load_checkpoint, save_checkpoint
from minidist.nn import Linear, Module
from minidist.optim import AdamW
from minidist.parallel import DistributedDataParallel, DistributedSampler

STEPS, LENGTH, PER_RANK, D_IN, D_OUT = 8, 40, 4, 5, 3


class Net(Module):
    def __init__(self):
        super().__init__()
        gen = backend.Generator(0)
        self.fc1 = Linear(D_IN, 8, dtype="float64", generator=gen)
        self.fc2 = Linear(8, D_OUT, dtype="float64", generator=gen)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


def main(directory: str, kills: str) -> None:
    dist.init_process_group()
    rank, attempt = dist.get_rank(), int(os.environ.get("MINIDIST_RESTART_COUNT", "0"))
    doomed = {int(s) for a, r, s in (k.split(":") for k in kills.split(",") if k)
              if int(a) == attempt and int(r) == rank}
    model = Net()
    ddp = DistributedDataParallel(model)
    opt = AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    sampler = DistributedSampler(LENGTH, seed=3)
    ckpt = os.path.join(directory, "ckpt.npz")
    start = 0
    if os.path.exists(ckpt):  # a restart: resume where the last checkpoint left off
        start = load_checkpoint(ckpt, model, opt, sampler)["step"] + 1
    if attempt > 0:           # (at step 0 when attempt 0 died before its first save)
        print(f"attempt {attempt}: resuming at step {start}", flush=True)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((LENGTH, D_IN)), rng.standard_normal((LENGTH, D_OUT))
    it = iter(sampler)
    for step in range(start, STEPS):
        idx, it = next_indices(sampler, it, PER_RANK)
        diff = ddp(Tensor(backend.from_host(x[idx]))) - Tensor(backend.from_host(y[idx]))
        (diff * diff).mean().backward()
        if step in doomed:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        opt.zero_grad()
        save_checkpoint(ckpt, model, opt, sampler, extra=dict(step=step))
    if rank == 0:
        np.savez(os.path.join(directory, "final.npz"),
                 **{k: backend.to_host(p.data) for k, p in model.named_parameters()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
