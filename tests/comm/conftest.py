"""Fixtures for the multi-process tests: worlds that stay up between examples.

Starting a world costs a second (spawned interpreters import NumPy), so the
tests keep one running and send it test cases; ``worlds.get(n)`` returns the
running world if it has the right size and is healthy, or replaces it. Tests
that take a world size from the module-scoped ``world_size`` fixture are
grouped by pytest so that each size is started once per module.

Every world has a run timeout (a test fails instead of hanging CI), and at the
end of the session no process of a world and no shared-memory segment created
by this process may remain.
"""
import os

import pytest

from minidist.comm import World
from minidist.comm.transport import shm

# Small slots so that messages of a few thousand elements are cut into pieces
# and pipelined through the channel, as large ones are in real runs.
TEST_SLOT_BYTES = 4096
RUN_TIMEOUT = 90.0


class Worlds:
    def __init__(self):
        self.world, self.key = None, None

    def get(self, size, **options):
        key = (size, tuple(sorted(options.items())))
        if self.world is not None and (self.key != key or self.world.closed):
            self.world.close()
            self.world = None
        if self.world is None:
            opts = dict(timeout=20.0, slot_bytes=TEST_SLOT_BYTES, nslots=4,
                        run_timeout=RUN_TIMEOUT)
            opts.update(options)
            self.world, self.key = World(size, **opts), key
        return self.world

    def close(self):
        if self.world is not None:
            self.world.close()
            self.world = None


@pytest.fixture(scope="session")
def worlds():
    w = Worlds()
    yield w
    w.close()
    mine = [s for s in shm.leftover_segments() if s.startswith(f"{shm.PREFIX}{os.getpid()}_")]
    assert not mine, f"shared-memory segments left behind: {mine}"


@pytest.fixture(scope="module", params=range(1, 9), ids=lambda n: f"world{n}")
def world_size(request):
    return request.param


def my_segments():
    """Segments in /dev/shm created by this test process."""
    return [s for s in shm.leftover_segments() if s.startswith(f"{shm.PREFIX}{os.getpid()}_")]


def alive(pid):
    """Is process ``pid`` running (a zombie, dead but not yet reaped by whoever
    inherited it, is not)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, IndexError):
        return True                 # no /proc: kill(pid, 0) is all we know
    return state not in ("Z", "X")
