"""A training loop of all-reduces across two hosts whose one host's ranks are killed.

Run by test_killed_host.py under scripts/two_hosts.py's mpiexec. Every rank
all-reduces a gradient-sized array step after step (a bounded loop); rank 0
prints ``step k`` after each, and the test kills every rank of host b once it
has seen a few. The ranks of host a must then stop with an error naming the
ranks they wait for, within the collective timeout (argv[1] seconds).
"""
import sys
import time

import minidist.distributed as dist
from minidist import backend

timeout = float(sys.argv[1])
dist.init_process_group(timeout=timeout)
grad = backend.xp.ones(1 << 16)
for step in range(2000):                     # bounded: ~minutes at most, never forever
    dist.all_reduce(grad, op=dist.ReduceOp.AVG)
    if dist.get_rank() == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.02)
print(f"rank {dist.get_rank()}: the loop ended without the kill", flush=True)
