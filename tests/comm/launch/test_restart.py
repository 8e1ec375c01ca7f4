"""Elastic restart: a rank killed at a random step, the world started again, the job
finished from its last checkpoint, and the weights equal an uninterrupted run bit for bit."""
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

SCRIPT = pathlib.Path(__file__).with_name("elastic_train.py")
STEPS = 8


def _train(directory, *flags, kills=""):
    os.makedirs(directory, exist_ok=True)
    cmd = [sys.executable, "-m", "minidist.cli", "run", "-n", "2", *flags, str(SCRIPT),
           str(directory), kills]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def _weights(directory):
    with np.load(directory / "final.npz") as f:
        return {k: f[k] for k in f.files}


def test_a_rank_killed_at_random_steps_restarts_and_ends_bit_equal(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    # Attempt 0 dies in step `first`. Attempt 1 resumes at `first`, or at first + 1 when
    # the rank that died was not rank 0 and rank 0 saved step `first` before it noticed.
    first = rng.randrange(STEPS - 1)
    second = rng.randrange(first + 1, STEPS)        # attempt 1 dies here
    kills = f"0:{rng.randrange(2)}:{first},1:{rng.randrange(2)}:{second}"
    why = f"seed {seed}, kills {kills}"

    straight = _train(tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    out = _train(tmp_path / "elastic", "--max-restarts", "2", kills=kills)
    assert out.returncode == 0, why + "\n" + out.stderr
    assert "restarting every rank (restart 1 of 2)" in out.stderr, why
    assert "restarting every rank (restart 2 of 2)" in out.stderr, why
    assert "exited with code -9 (SIGKILL)" in out.stderr, why
    assert (f"[rank 0] attempt 1: resuming at step {first}" in out.stdout or
            f"[rank 0] attempt 1: resuming at step {first + 1}" in out.stdout), why
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "elastic")
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), (why, k, np.max(np.abs(a[k] - b[k])))
    assert not [f for f in os.listdir(tmp_path / "elastic") if ".tmp-" in f]


def test_without_restarts_left_the_job_fails_with_status_1(tmp_path):
    out = _train(tmp_path / "run", "--max-restarts", "1", kills="0:1:2,1:0:3")
    assert out.returncode == 1
    assert "restart 1 of 1" in out.stderr and "failed in each of its 2 attempts" in out.stderr
