"""The script of test_replacement.py, run as
``minidist run --fault-tolerant --max-restarts 1 -n 3 ft_replace_train.py OUT KILL_STEP``.

Three replicas (a rank each) train with per-step fault tolerance; rank 2 kills itself
(SIGKILL) before step KILL_STEP; the launcher starts a replacement, which heals from a
peer at the next quorum. Every rank saves its parameters and AdamW state after each
committed step into OUT (``rank{r}.{incarnation}.step{s}.npz``), and a healed rank
the state it joined with (``rank{r}.{incarnation}.join{s}.npz``). The run ends 5 steps
after the replacement joined (a rule every member computes alike), or at MAX_STEPS.
"""
import os
import signal
import sys
import time

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.nn import Linear, Module
from minidist.optim import AdamW
from minidist.parallel.fault_tolerance import (DistributedDataParallel, Manager,
                                               OptimizerWrapper)

MAX_STEPS = 1500      # the replacement takes seconds to start on a loaded machine
STEP_S = 0.01         # each step sleeps this long, so that those seconds are steps


class Net(Module):
    def __init__(self, seed):
        super().__init__()
        gen = backend.Generator(seed)
        self.fc1 = Linear(3, 8, dtype="float64", generator=gen)
        self.fc2 = Linear(8, 2, dtype="float64", generator=gen)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


def save(path, model, optimizer):
    arrays = {f"param.{n}": backend.to_host(p.data) for n, p in model.named_parameters()}
    for i, buffers in optimizer.state_dict()["state"].items():
        for key, value in buffers.items():
            arrays[f"optim.{i}.{key}"] = np.array(backend.to_host(value)
                                                  if backend.is_array(value) else value)
    np.savez(path, **arrays)


def main():
    out, kill_step = sys.argv[1], int(sys.argv[2])
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    incarnation = int(os.environ.get("MINIDIST_REPLACEMENT", "0"))
    model = Net(seed=rank)                       # the first quorum makes them alike
    inner = AdamW(model.parameters(), lr=0.05)
    run = {"joined": -1}                         # the step the replacement joined at

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict(), "run": dict(run)}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        run.update(state["run"])

    manager = Manager(load_state_dict, state_dict, min_replica_size=2, log=True)
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner, model)
    while True:
        if not optimizer.zero_grad():
            break
        step = manager.current_step()
        if run["joined"] < 0 and step > kill_step and manager.num_participants() == world:
            run["joined"] = step
            if incarnation:
                save(f"{out}/rank{rank}.{incarnation}.join{step}.npz", model, inner)
        if step >= MAX_STEPS or (run["joined"] >= 0 and step >= run["joined"] + 5):
            break
        if rank == 2 and incarnation == 0 and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        rng = np.random.default_rng([step, rank])
        x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
        diff = ddp(Tensor(backend.from_host(x))) - Tensor(backend.from_host(y))
        (diff * diff).mean().backward()
        ddp.sync_gradients()
        if optimizer.step():
            save(f"{out}/rank{rank}.{incarnation}.step{step + 1}.npz", model, inner)
        time.sleep(STEP_S)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
