"""Once a death has failed the step, the step's remaining all-reduces make no call: each
would fail on every member anyway, after the transport's wait had spun idle (the time
lost per failure, docs/fault_tolerance.md); after a timeout, where nobody is seen dead,
the call is still made, so that the members' calls stay in step."""
import pytest

import minidist.distributed as dist
from minidist.backend import xp
from minidist.comm.errors import CommTimeoutError, PeerDiedError
from minidist.parallel.fault_tolerance import Manager
from minidist.parallel.fault_tolerance import manager as manager_module


@pytest.fixture
def manager(monkeypatch):
    dist.init_process_group()
    m = Manager(lambda state: None, lambda: {})
    assert m.start_quorum()
    calls = []
    monkeypatch.setattr(manager_module, "all_reduce", lambda t, **kw: calls.append(kw))
    yield m, calls
    dist.destroy_process_group()


def test_after_a_death_the_steps_all_reduces_make_no_call(manager):
    m, calls = manager
    m.report_error(PeerDiedError("rank 1 of the collective it is in has died", rank=1))
    grad = xp.ones(3)
    m.allreduce(grad)
    assert calls == [] and float(grad.sum()) == 3.0
    assert not m.should_commit()


def test_after_a_timeout_the_call_is_still_made(manager):
    m, calls = manager
    m.report_error(CommTimeoutError("no message from rank 1 in 20 s"))
    m.allreduce(xp.ones(3))
    assert len(calls) == 1
