"""`minidist run --fault-tolerant --max-restarts 1`: a rank killed mid-run is replaced by a
new process, as the same rank, which heals from a live peer at the next quorum: its
parameters and AdamW state are bit-identical to its peers' at the step it joins, and it
trains in lock-step with them from then on; the run prints one line per change of the
quorum, and leaves no shared-memory segment behind."""
import glob
import pathlib
import re
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = pathlib.Path(__file__).with_name("ft_replace_train.py")


def _load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _assert_bit_identical(a, b, what):
    assert sorted(a) == sorted(b), what
    for key in a:
        assert np.array_equal(a[key], b[key]), f"{key} {what}"


@settings(max_examples=2, deadline=None)
@given(kill_step=st.integers(0, 6))
def test_a_replacement_heals_bit_identical_and_trains_in_lock_step(tmp_path_factory, kill_step):
    out = tmp_path_factory.mktemp("ft")
    cmd = [sys.executable, "-m", "minidist.cli", "run", "--fault-tolerant",
           "--max-restarts", "1", "-n", "3", str(SCRIPT), str(out), str(kill_step)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    stdout, stderr = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, stderr
    assert not glob.glob(f"/dev/shm/minidist_{launcher.pid}_*")     # nothing left behind
    assert f"[rank 0] step {kill_step}: replica 2 left (rank 2: SIGKILL), quorum 2 of 3\n" \
        in stdout
    healed = re.search(r"\[rank 0\] step (\d+): replica 2 healed from replica 0 in \d+ ms",
                       stdout)
    assert healed, stdout
    assert "rank 2 lost (exit code -9 (SIGKILL)); a new process took it over" in stderr
    join = int(healed.group(1))
    assert join > kill_step
    _assert_bit_identical(_load(out / f"rank2.1.join{join}.npz"),
                          _load(out / f"rank0.0.step{join}.npz"), f"at the join step {join}")
    for step in range(join + 1, join + 6):                   # then in lock-step
        mine = _load(out / f"rank2.1.step{step}.npz")
        for peer in (0, 1):
            _assert_bit_identical(mine, _load(out / f"rank{peer}.0.step{step}.npz"),
                                  f"after step {step}, against rank {peer}")
