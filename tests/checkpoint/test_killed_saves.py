"""A save killed with SIGKILL at a random point leaves nothing that outlives the next
save or load in the same directory: no ``.NAME.tmp-PID`` file, no half-written version
directory; the last complete checkpoint is always there and loads."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minidist.comm import World
from minidist.comm.transport import shm

from . import resume_cases as R

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

# Saves again and again, big enough that a save takes tens of milliseconds.
WRITER = textwrap.dedent("""
    import sys
    import minidist.distributed as dist
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.checkpoint import save_checkpoint, save_sharded
    from minidist.parallel import Zero1
    kind, path = sys.argv[1], sys.argv[2]
    model = Linear(600, 1000, dtype="float64")
    if kind == "single":
        opt = AdamW(model.parameters())
        for i in range(10**6):
            save_checkpoint(path, model, opt)
            print("saved", i, flush=True)
    else:
        dist.init_process_group()
        zero = Zero1(model, AdamW)
        for i in range(10**6):
            save_sharded(path, zero)
            print("saved", i, flush=True)
""")


def _kill_at_a_random_point(kind, path, rng):
    """Start the writer, let it finish one save, then kill it at a random moment."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, kind, path],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("saved"), "the writer did not save"
        time.sleep(rng.uniform(0.0, 0.15))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    # the writer's own world-of-one segment is removed by its resource tracker
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and _segments_of(proc.pid):
        time.sleep(0.05)
    assert not _segments_of(proc.pid)


def _segments_of(pid):
    return [s for s in shm.leftover_segments() if s.startswith(f"{shm.PREFIX}{pid}_")]


def _debris(directory, older_ok=False):
    """Temporaries anywhere below ``directory``, and version directories other than
    LATEST's (``older_ok``: but older ones, complete, which a load must not remove)."""
    found = []
    for root, dirs, files in os.walk(directory):
        found += [os.path.join(root, f) for f in files if ".tmp-" in f]
    latest = os.path.join(directory, "LATEST")
    if os.path.exists(latest):
        keep = int(open(latest).read().strip()[1:])
        found += [d for d in os.listdir(directory) if d.startswith("v") and
                  (int(d[1:]) > keep if older_ok else int(d[1:]) != keep)]
    return found


def _load_single(path):
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.checkpoint import load_checkpoint
    model = Linear(600, 1000, dtype="float64")
    load_checkpoint(path, model, AdamW(model.parameters()))


def _save_single(path):
    from minidist.nn import Linear
    from minidist.checkpoint import save_checkpoint
    save_checkpoint(path, Linear(600, 1000, dtype="float64"))


def _zero():
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.parallel import Zero1
    return Zero1(Linear(600, 1000, dtype="float64"), AdamW)


def _load_sharded(path):
    from minidist.checkpoint import load_sharded
    load_sharded(path, _zero())


def _save_sharded(path):
    from minidist.checkpoint import save_sharded
    save_sharded(path, _zero())


@pytest.fixture(scope="module")
def world1():
    w = World(1, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["single", "sharded"])
def test_a_killed_save_leaves_nothing_after_the_next_load_or_save(world1, tmp_path, kind):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    left_something = 0
    for trial in range(4):
        directory = str(tmp_path / f"{kind}{trial}")
        path = os.path.join(directory, "ckpt.npz") if kind == "single" else directory
        _kill_at_a_random_point(kind, path, rng)
        left_something += bool(_debris(directory))
        # the next load finds the last complete checkpoint, and clears what the kill left
        world1.run(_load_single if kind == "single" else _load_sharded, path)
        assert _debris(directory, older_ok=True) == [], (seed, trial)
        _kill_at_a_random_point(kind, path, rng)
        world1.run(_save_single if kind == "single" else _save_sharded, path)
        assert _debris(directory) == [], (seed, trial)
    print(f"{kind}: {left_something} of 4 kills left debris (seed {seed})")
