"""A wait that blocks is communication in the trace: rank 1 holds its message back while
rank 0 waits for it inside a module's forward, and the summary counts that wait as
exposed communication, not as the module's compute (an ``irecv``'s handle, an
``isend``'s, and an async collective's ``Work``)."""
import pytest

from minidist.comm import World
from minidist.trace import load
from minidist.trace.summary import summarize

HOLD_S = 0.05          # how long rank 1 holds its messages back


def waits_inside_a_forward(path):
    import time

    import minidist.distributed as dist
    from minidist import trace
    from minidist.backend import xp
    from minidist.nn import Module

    class Waits(Module):
        def forward(self):
            buf = xp.zeros(8, dtype="float32")
            if dist.get_rank() == 0:
                dist.irecv(buf, 1, tag=1).wait()                       # a point-to-point wait
                dist.all_reduce(buf, async_op=True).wait()             # a collective's Work
            else:
                time.sleep(HOLD_S)
                dist.isend(buf, 0, tag=1).wait()
                time.sleep(HOLD_S)
                dist.all_reduce(buf)
            return buf

    dist.barrier()                              # the two start together (and untraced)
    with trace.record(path):
        Waits()()


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("wait") / "run.json")
    with World(2, timeout=20.0) as world:
        world.run(waits_inside_a_forward, path)
    return summarize(load(path))


def test_a_blocking_wait_is_exposed_communication(summary):
    waiting = next(row for row in summary["ranks"].values() if row["name"].startswith("rank 0"))
    # rank 0 waits about 2 * HOLD_S in all; at least HOLD_S of it, however the two ranks
    # are scheduled on a loaded machine (counted as compute, it was 0)
    assert waiting["exposed_comm"] >= HOLD_S * 1e6               # microseconds
