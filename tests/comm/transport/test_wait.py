"""The one wait loop (transport/wait.py): spin, yield, then a long wait until reset."""
import time

from hypothesis import given, settings, strategies as st

from minidist.comm.transport import wait
from minidist.comm.transport.wait import CLOCK_EVERY, Backoff


@settings(max_examples=20, deadline=None)
@given(free=st.integers(1, 100), polls=st.integers(1, 3 * CLOCK_EVERY))
def test_yields_only_after_the_free_polls(free, polls):
    yields = []
    saved, wait.sched_yield = wait.sched_yield, lambda: yields.append(1)
    try:
        b = Backoff(spin_s=60.0, free_polls=free)
        for _ in range(polls):
            assert not b.idle()          # far from spin_s: never long
    finally:
        wait.sched_yield = saved
    assert len(yields) == max(0, polls - free + 1)


def test_no_spin_is_long_at_once():
    b = Backoff(spin_s=0.0, free_polls=32)
    assert b.idle() and b.idle()
    b.reset()
    assert b.polls == 0 and b.since is None


def test_long_after_spin_s_of_idleness_then_at_every_clock_look():
    spin_s = 0.02
    b = Backoff(spin_s=spin_s, free_polls=10**9)
    start = time.monotonic()
    while not b.idle():
        pass
    assert time.monotonic() - start >= spin_s     # never before spin_s has passed
    assert b.idle_seconds() >= spin_s
    answers = [b.idle() for _ in range(CLOCK_EVERY)]
    assert answers == [False] * (CLOCK_EVERY - 1) + [True]


def test_naps_double_up_to_the_cap(monkeypatch):
    slept = []
    monkeypatch.setattr(wait.time, "sleep", slept.append)
    b = Backoff()
    for _ in range(10):
        b.nap()
    assert slept[0] == wait.FIRST_NAP and max(slept) == wait.MAX_NAP
    assert all(b_ == min(2 * a, wait.MAX_NAP) for a, b_ in zip(slept, slept[1:]))
