"""Demos under ``minidist run`` / ``mpiexec``: this process is then one rank of a world
the demo did not start.

A demo that compares a world with one process (or several worlds of different sizes)
starts its own worlds. Run by ``minidist run -n N`` it would start them inside a rank,
where processes cannot have children; such a demo says so in one line (from rank 0)
and exits 0: ``one_process_only(why)`` at the start of its main. Demos 02, 04 and 19
join the launched world instead (``dist.launched()``).
"""
import os
import sys

from minidist import distributed as dist

# where the launcher puts this process's rank: minidist run (as torchrun), then MPI's
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def one_process_only(why: str) -> None:
    """Under ``minidist run`` / ``mpiexec``: rank 0 prints why this demo starts its own
    worlds and how to run it; every rank exits 0. Otherwise nothing."""
    if not dist.launched():
        return
    rank = next((os.environ[k] for k in RANK_VARIABLES if k in os.environ), "0")
    if rank == "0":
        script = sys.argv[0]
        print(f"{os.path.basename(script)} runs as one process: {why}. "
              f"Run it as `python {script}`.")
    sys.exit(0)
