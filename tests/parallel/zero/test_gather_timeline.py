"""ZeRO-3's gather timeline: with prefetch, each unit's all-gather is posted while
the previous unit still computes; without, every gather waits for its unit.

Structure only, never durations: the order of the recorded instants is fixed by
the code (a prefetch is posted right after the previous unit got its weights,
before it computes), whatever the machine's load.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World


@pytest.fixture(scope="module")
def world():
    w = World(2, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


def timeline_of(layers: int, width: int, prefetch: bool, steps: int = 2) -> list:
    """Rank's gather timeline of the last of ``steps`` steps of an MLP under Zero3."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import Generator
    from minidist.nn import Linear, Sequential
    from minidist.optim import SGD
    from minidist.parallel import Zero3

    model = Sequential(*[Linear(width, width, generator=Generator(i)) for i in range(layers)])
    z = Zero3(model, SGD, prefetch=prefetch, lr=1e-2)
    x = Tensor(Generator(10 + dist.get_rank()).normal((3, width)))
    for _ in range(steps):
        z(x).sum().backward()
        z.step()
        z.zero_grad()
    return z.gather_timeline


def uses(timeline: list, phase: str) -> list:
    return [e for e in timeline[:-1] if e["phase"] == phase]


@settings(max_examples=4, deadline=None)
@given(layers=st.integers(2, 5), width=st.sampled_from([4, 64, 256]))
def test_prefetched_gather_is_posted_before_the_previous_unit_computes(world, layers, width):
    for timeline in world.run(timeline_of, layers, width, True):
        for phase, order in (("forward", list(range(layers))),
                             ("backward", list(reversed(range(layers))))):
            events = uses(timeline, phase)
            assert [e["unit"] for e in events] == order
            assert not events[0]["prefetched"]       # nothing ran before the first
            for prev, e in zip(events, events[1:]):
                assert e["prefetched"], (phase, e)
                assert prev["needed_ms"] <= e["issued_ms"] < prev["compute_end_ms"], (prev, e)
                assert e["issued_ms"] <= e["gather_start_ms"] <= e["gather_end_ms"]
        assert 0.0 <= timeline[-1]["hidden_fraction"] <= 1.0


def test_without_prefetch_no_gather_hides(world):
    for timeline in world.run(timeline_of, 3, 64, False):
        assert len(timeline) == 1 + 2 * 3
        for e in timeline[:-1]:
            assert not e["prefetched"] and e["issued_ms"] is None
            assert e["gather_start_ms"] == e["needed_ms"] <= e["gather_end_ms"] <= e["compute_end_ms"]
        assert timeline[-1]["hidden_fraction"] == 0.0


class _FakeWork:
    def __init__(self, issued, start, end):
        self.issued_at, self.started_at, self.finished_at = issued, start, end


@settings(max_examples=50, deadline=None)
@given(spans=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
                      min_size=1, max_size=6))
def test_hidden_fraction_is_the_share_of_gather_time_before_the_unit_needed_it(spans):
    """Against a direct sum over the intervals."""
    from minidist.parallel.zero import gather_timeline as G

    t = G.GatherTimeline()
    expected_hidden = expected_total = 0.0
    for i, (a, b, c) in enumerate(spans):
        start, end = min(a, b), max(a, b)       # s after t0 = 0 (the first issue)
        e = t.needed(i, "forward", _FakeWork(0.0, start, end), 0.0)
        e["needed"] = needed = c                # when the unit asked, set by hand
        expected_hidden += max(0.0, min(end, needed) - start)
        expected_total += end - start
    timeline = t.finish()
    want = expected_hidden / expected_total if expected_total > 0 else 0.0
    assert timeline[-1]["hidden_fraction"] == pytest.approx(want, abs=1e-9)
    assert t.events == [] and t.t0 is None      # ready for the next step
