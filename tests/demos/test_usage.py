"""A bad demo argument is a usage error naming the reason, not a traceback."""
import subprocess
import sys

import pytest

from tests.demos.smoke import DEMOS

# argparse refuses before any array is made: the NumPy pass is the whole check
pytestmark = pytest.mark.host_only


# a bad number, or numbers that do not fit together, and the reason the demo gives
BAD_ARGS = [
    ("02_collectives.py", ["-n", "0"], "positive integer"),
    ("01_autograd.py", ["--n-head", "3"], "not divisible by n_head"),
    ("01_autograd.py", ["--dropout", "1"], "[0, 1)"),
    ("03_ring_allreduce.py", ["-n", "1"], "at least 2"),
    ("04_ddp.py", ["--bucket-mb", "0"], "> 0"),
    ("06_tensor_parallel.py", ["--tp", "3"], "must divide"),
    ("07_pipeline.py", ["-p", "3"], "multiple of -p"),
    ("08_3d_parallel.py", ["--tp", "3"], "must divide"),
    ("11_ring_attention.py", ["-n", "3"], "divisible by 2 x -n"),
    ("11_ring_attention.py", ["--window", "8", "--no-causal"], "needs causal"),
    ("12_checkpoints.py", ["--steps", "3"], "below --steps"),
    ("13_diagnostics.py", ["--bug-rank", "9"], "rank below -n"),
    ("15_moe.py", ["--top-k", "9"], "at most --experts"),
    ("16_ulysses.py", ["--lengths", "3"], "divisible by -n"),
    ("18_compression.py", ["--steps", "-2"], "positive integer"),
    ("24_planner.py", ["--model", "gpt9"], "unknown model preset"),
    ("19_topology.py", ["-n", "3"], "must divide"),
    ("21_llama.py", ["--tp", "4"], "must divide the 2 key/value heads"),
    ("22_placements.py", ["-n", "3"], "must divide --width"),
    ("29_compose.py", ["--layout", "dq=2"], "unknown 'dq=2'"),
    ("29_compose.py", ["--layout", "dp_shard=2 ep=3"], "ep=3"),
]


@pytest.mark.parametrize("name,args,reason", BAD_ARGS, ids=[f"{n} {' '.join(a)}" for n, a, _ in BAD_ARGS])
def test_a_bad_argument_is_a_usage_error_not_a_traceback(name, args, reason):
    proc = subprocess.run([sys.executable, str(DEMOS / name), *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "usage:" in proc.stderr, proc.stderr[-2000:]
    assert reason in proc.stderr, proc.stderr[-2000:]
