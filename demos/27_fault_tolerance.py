"""Demo 27: a failure costs one step, not a restart: per-step fault tolerance.

Four ranks; three replicas train a tanh MLP, averaging gradients over a quorum
(minidist/parallel/fault_tolerance/, torchft's model), and the fourth waits as a spare.
The same run three ways:

    uninterrupted   nobody dies
    per-step FT     replica 1 is killed (SIGKILL) in backward at --kill-step: that step
                    commits nowhere, the spare joins the next quorum, healed from
                    replica 0 (parameters, AdamW state, step, the sampler's position),
                    and training goes on
    restart         the same kill in a world that stops when a rank dies (as torchrun
                    does): a new world starts, loads the checkpoint written every
                    --ckpt-every steps, and recomputes the steps since

It prints each run's wall time, the time one failure costs each way by the goodput
formula (docs/fault_tolerance.md), its terms measured in the runs, and the time lost
measured from the kill (time stamps), and checks that the FT run's
replicas end bitwise equal, that the spare was healed, and that every run trains.

    python demos/27_fault_tolerance.py                       # 5 s on 2 cores (load 7)
    python demos/27_fault_tolerance.py --figure /tmp/ft.png  # loss vs wall time
"""
import argparse
import os
import signal
import sys
import tempfile
import time
from typing import NamedTuple

from minidist.comm import RankFailedError, World
from _args import positive, positive_int
from _launched import one_process_only
from _teacher import tanh_mlp
from _teacher import teacher as teacher_matrix


def mark(path, what, step):
    """Append "what step time" to ``path`` (time.monotonic(): one clock for every process
    of the machine), so the time lost can be read off from the kill on."""
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {step} {time.monotonic()!r}\n")


def die(path, step):
    mark(path, "kill", step)
    os.kill(os.getpid(), signal.SIGKILL)


def train_rank(args, kill_at, start_step, ckpt, marks=None):
    """One rank: quorum, forward, backward, the quorum's all-reduce, commit. ``marks``:
    the file where rank 0 notes each step's start and commit, and the victim its kill."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor, no_grad
    from minidist.backend import Generator, xp
    from minidist.checkpoint import load_file, save_file
    from minidist.optim import AdamW
    from minidist.parallel.fault_tolerance import (DistributedDataParallel, Manager,
                                                   OptimizerWrapper)
    model, cursor = tanh_mlp(args.width), {"next": start_step}
    inner = AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    load_s = time.perf_counter()
    if start_step:                                   # a restart: from the checkpoint
        state = load_file(ckpt)
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
    load_s = time.perf_counter() - load_s

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict(), "cursor": cursor}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        cursor.update(state["cursor"])

    manager = Manager(load_state_dict, state_dict, num_replicas=3, log=True)
    ddp = DistributedDataParallel(manager, model)
    optimizer = OptimizerWrapper(manager, inner, model)
    teacher, me = teacher_matrix(args.width), dist.get_rank()
    held_x = Generator(7).normal((256, args.width))
    held_y = xp.tanh(held_x @ teacher)
    losses, times, begin = [], [], time.perf_counter()
    while cursor["next"] < args.steps:
        if not optimizer.zero_grad():
            break                                    # a spare never needed
        step = cursor["next"]
        cursor["next"] += 1
        if me == 0:
            mark(marks, "start", step)
        x = Generator(1000 * step + manager.replica_id()).normal((args.batch, args.width))
        if me == kill_at[0] and step == kill_at[1]:
            model[0].weight.register_post_accumulate_grad_hook(
                lambda p: die(marks, step))                    # mid-backward
        diff = ddp(Tensor(x)) - Tensor(xp.tanh(x @ teacher))
        (diff * diff).mean().backward()
        ddp.sync_gradients()
        if optimizer.step() and me == 0:
            mark(marks, "commit", step)
        with no_grad():
            d = model(Tensor(held_x)) - Tensor(held_y)
            losses.append((step, float((d * d).mean().item())))
        times.append(time.perf_counter() - begin)
        if ckpt and me == 0 and (step + 1) % args.ckpt_every == 0:
            save_file(ckpt, {"model": model.state_dict(), "optim": inner.state_dict()})
    params = [p.data.copy() for p in model.parameters()]
    return dict(losses=losses, times=times, params=params, changes=manager.changes,
                load_s=load_s)


def read_marks(path):
    """[(what, step, time)] from the marks file, in time order."""
    with open(path) as f:
        rows = [line.split() for line in f]
    return sorted(((w, int(s), float(t)) for w, s, t in rows), key=lambda r: r[2])


def step_seconds(marks):
    """T_step: the median time from a step's start to the next step's start, on rank 0:
    one pass of the loop (quorum, forward, backward, all-reduce, commit, the held-out
    loss), what a dropped or redone step costs. Starts next in time whose steps follow
    on (a restart's first step after the kill does not, nor one after a dropped step)."""
    starts = [(s, t) for w, s, t in marks if w == "start"]          # in time order
    spans = sorted(b - a for (s, a), (n, b) in zip(starts, starts[1:]) if n == s + 1)
    return spans[len(spans) // 2]


def time_lost(marks, step_s):
    """Measured from the marks, from the kill on: (kill -> the first commit that takes
    the run past where it was, lost). Without the failure, the step after rank 0's
    commit of step s-1 (s the failed step) would have committed ``step_s`` (T_step,
    commit to commit) later, so

        lost = that commit's time - rank 0's commit of step s-1 - T_step

    the failed step's pass of the loop, the detection, the new quorum or world, the
    reload and any recomputed steps. (Not from the failed step's start: rank 0 may
    start it after the victim, which is ahead in the loop, has died.)"""
    kill_t, killed = next((t, s) for w, s, t in marks if w == "kill")
    before = next(t for w, s, t in marks if w == "commit" and s == killed - 1)
    # per-step FT: the first commit after the kill, of the next step (the failed one is
    # dropped); restart: the commit of the failed step, redone by the new world after the
    # steps since the checkpoint
    again = next(t for w, s, t in marks if w == "commit" and t > kill_t and s >= killed)
    return again - kill_t, again - before - step_s


def detect_seconds(marks, noticed):
    """T_detect: from the kill to the launcher seeing the death (``World.noticed``, on the
    same clock). The operating system's part: it reports a SIGKILLed process (its
    sentinel) once the kernel has torn it down; the survivors see the launcher's mark at
    their next empty poll (comm/transport/local_wait.py)."""
    kill_t = next(t for w, s, t in marks if w == "kill")
    return min(noticed.values()) - kill_t


def heal_seconds(results):
    """T_heal: from the source beginning to form the quorum that heals the spare to the
    last member of it done, the healed one holding the state (loaded), over every
    survivor's ``QuorumChange`` of that quorum. Their ``began``/``ended`` are
    time.monotonic(): one clock for every process on Linux (CLOCK_MONOTONIC), where
    perf_counter's zero is each process's own. 0.0 if nobody healed after step 0."""
    changes = [c for r in results for c in r["changes"] if c.healed and c.step > 0]
    if not changes:
        return 0.0
    step = max(c.step for c in changes)                  # the last healing of the run
    source = next(c for c in changes if c.step == step and c.bytes)
    return max(c.ended for c in changes if c.step == step) - source.began


def restart_run(args, ckpt, uninterrupted, marks=None):
    """The kill in a world that stops; then a new world from the last checkpoint. Its
    curve: the uninterrupted run's up to the kill (the same data, the same math), then
    the new world's from the checkpoint on, after its start and the reload. Also
    returns, on time.monotonic(): when the launcher saw the death (``noticed``), when
    the stopped world was gone (``stopped``: its survivors ended, its segment removed)
    and when the new world was up (``started``)."""
    begin = time.perf_counter()
    try:
        with World(3, timeout=30.0) as world:
            first = time.perf_counter()              # training from here: the first start out
            world.run(train_rank, args, (1, args.kill_step), 0, ckpt, marks)
    except RankFailedError as e:
        stopped = time.monotonic()                   # run() raises once the world is closed
        print(f"restart run: rank {e.rank} failed ({e.exc_type}); starting a new world")
        noticed = world.noticed                      # when the launcher saw the death
    resume = (args.kill_step // args.ckpt_every) * args.ckpt_every
    again = time.perf_counter()
    with World(3, timeout=30.0) as world:
        start_s, started = time.perf_counter() - again, time.monotonic()
        result = world.run(train_rank, args, (-1, -1), resume, ckpt, marks)[0]
    killed_at = uninterrupted["times"][args.kill_step]        # the failed step's end, about
    shift = killed_at + start_s + result["load_s"]
    result["times"] = uninterrupted["times"][:args.kill_step] + [shift + t for t in
                                                                   result["times"]]
    result["losses"] = uninterrupted["losses"][:args.kill_step] + result["losses"]
    result.update(wall=time.perf_counter() - begin, resume=resume, start_s=start_s,
                  train_s=time.perf_counter() - first, noticed=noticed, stopped=stopped,
                  started=started)
    return result


class RestartTerms(NamedTuple):
    """The restart's lost time, term by term, measured in its run (seconds)."""
    detect: float    # the kill -> the launcher sees the death (the OS's teardown)
    stop: float      # -> the stopped world gone: its survivors ended, joined, its segment
                     # removed (World.close after a failure)
    start: float     # -> the new world up: 3 interpreters spawned, minidist imported,
                     # the process group initialised
    init: float      # -> its first step's start, the reload left out: the run sent to
                     # the ranks, the model and optimizer built, the first quorum (which
                     # makes every replica alike: a transfer of the state)
    reload: float    # reading the checkpoint (rank 0's)

    def total(self, redo: int, step: float) -> float:
        """T_detect + T_stop + T_start + T_init + T_reload + redo x T_step."""
        return self.detect + self.stop + self.start + self.init + self.reload + redo * step


def restart_terms(marks, restart) -> RestartTerms:
    """The terms of ``restart_run``'s lost time, from its marks and its stamps."""
    first = next(t for w, s, t in marks if w == "start" and t > restart["started"])
    return RestartTerms(detect_seconds(marks, restart["noticed"]),
                        restart["stopped"] - min(restart["noticed"].values()),
                        restart["started"] - restart["stopped"],
                        first - restart["started"] - restart["load_s"], restart["load_s"])


def ft_run(args, kill_at, marks=None):
    begin = time.perf_counter()
    with World(4, fault_tolerant=True, timeout=30.0) as world:
        results = world.run(train_rank, args, kill_at, 0, None, marks)
    survivors = [r for r in results if isinstance(r, dict) and r["losses"]]
    survivors[0]["wall"] = time.perf_counter() - begin
    survivors[0]["noticed"] = world.noticed          # when the launcher saw each death
    return survivors


def report(args, runs, ft, detect):
    """Each run's wall time, and the goodput formula with the terms measured here
    (``detect``: T_detect of the FT run, and the restart run's ``RestartTerms``)."""
    print(f"\n{'run':<16}{'last loss':>10}{'wall s':>8}   (world starts included; on a "
          f"loaded machine their difference is noise)")
    for label, r in runs.items():
        print(f"{label:<16}{r['losses'][-1][1]:>10.4f}{r['wall']:>8.2f}")
    times = runs["uninterrupted"]["times"]
    step_s = (times[-1] - times[0]) / (len(times) - 1)       # one step, world start left out
    heal = heal_seconds(ft)
    restart, terms = runs["restart"], detect["restart"]
    redo = args.kill_step - restart["resume"] + 1            # the failed step, and those before
    print(f"\nlost per failure, the goodput formula with the terms measured here "
          f"(load average {os.getloadavg()[0]:.1f}):")
    print(f"  per-step FT: one step + detection + healing = {step_s:.3f} + "
          f"{detect['ft']:.3f} + {heal:.3f} = {step_s + detect['ft'] + heal:.3f} s")
    print(f"  restart:     detection + stop + start + init + reload + {redo} steps = "
          f"{terms.detect:.3f} + {terms.stop:.3f} + {terms.start:.3f} + {terms.init:.3f} + "
          f"{terms.reload:.3f} + {redo * step_s:.3f} = {terms.total(redo, step_s):.3f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=40)
    parser.add_argument("--kill-step", type=positive_int, default=17)
    parser.add_argument("--ckpt-every", type=positive_int, default=10)
    parser.add_argument("--width", type=positive_int, default=64)
    parser.add_argument("--batch", type=positive_int, default=32, help="samples per replica")
    parser.add_argument("--lr", type=positive, default=3e-3)
    parser.add_argument("--figure", metavar="PATH", help="save loss vs wall time as a PNG")
    args = parser.parse_args()
    one_process_only("it starts its own worlds of 4 and 3 ranks")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {k: os.path.join(tmp, f"{k}.marks") for k in ("base", "ft", "restart")}
        runs = {"uninterrupted": ft_run(args, (-1, -1), paths["base"])[0]}
        ft = ft_run(args, (1, args.kill_step), paths["ft"])
        runs["per-step FT"] = ft[0]
        runs["restart"] = restart_run(args, os.path.join(tmp, "ckpt.minidist"),
                                      runs["uninterrupted"], paths["restart"])
        marks = {k: read_marks(p) for k, p in paths.items()}
    report(args, runs, ft, {"ft": detect_seconds(marks["ft"], ft[0]["noticed"]),
                            "restart": restart_terms(marks["restart"], runs["restart"])})
    step_s = step_seconds(marks["base"])
    print("measured from the kill (time stamps on one clock; lost = the first commit past "
          "where the run was - the commit before the failed step - one step):")
    for label, key in (("per-step FT", "ft"), ("restart", "restart")):
        interval, lost = time_lost(marks[key], step_s)
        print(f"  {label + ':':<13}kill -> commit {interval:.3f} s, lost {lost:.3f} s")
    if args.figure:
        from _figures import fault_tolerance_runs
        fault_tolerance_runs(args.figure, runs, args.kill_step)
    same = all((a == b).all() for r in ft[1:] for a, b in zip(ft[0]["params"], r["params"]))
    healed = any(c.healed == (3,) for c in ft[0]["changes"])
    trains = all(r["losses"][-1][1] < r["losses"][0][1] for r in runs.values())
    ok = same and healed and trains
    print(f"\ncheck: FT replicas bitwise equal at the end: {same}; the spare healed: {healed}; "
          f"every run trains: {trains}  {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
