"""The stats (stats.py): what the latency path counts per plan (``count`` on a
Tally, three stores) reads back as what the plain ``add`` counts, counter by
counter, at every step: totals, per collective, the last call; across resets
and the folding of tallies past MAX_TALLIES."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm.collectives import stats as stats_mod
from minidist.comm.collectives.stats import CommStats, Tally

_delta = st.tuples(*[st.integers(0, 1 << 20)] * 4)
_plans = st.lists(st.tuples(st.sampled_from(["all_reduce", "all_to_all_single"]), _delta),
                  min_size=1, max_size=80)
# a step: count a call of plan i, a call counted as it moves (point-to-point bytes), or reset
_steps = st.lists(st.one_of(st.tuples(st.just("call"), st.integers(0, 79), st.floats(0, 1)),
                            st.tuples(st.just("p2p"), st.integers(0, 1 << 16)),
                            st.just(("reset",))), max_size=200)


def _read(s: CommStats) -> tuple:
    """Every count; the seconds apart (summed in another order: equal up to rounding)."""
    rows = s.per_collective
    return (s.bytes_sent, s.bytes_recv, s.msgs_sent, s.msgs_recv, s.last,
            {k: {c: v for c, v in row.items() if c != "seconds"} for k, row in rows.items()},
            {k: pytest.approx(row["seconds"]) for k, row in rows.items()})


@settings(max_examples=60, deadline=None)
@given(_plans, _steps)
def test_counting_per_plan_reads_as_adding_every_counter(plans, steps):
    fast, plain = CommStats(), CommStats()
    tallies = [Tally(name, {"shape": (i,)}, delta) for i, (name, delta) in enumerate(plans)]
    for step in steps:
        if step[0] == "call":
            t = tallies[step[1] % len(tallies)]
            fast.count(t, step[2])
            plain.add(t.name, t.info, t.delta, step[2])
        elif step[0] == "p2p":
            for s in (fast, plain):
                s.counted.bytes_sent += step[1]
                s.counted.msgs_sent += 1
        else:
            fast.reset()
            plain.reset()
        assert _read(fast) == _read(plain)


def test_more_plans_than_max_tallies_fold_into_the_counted_totals():
    s = CommStats()
    tallies = [Tally("all_to_all_single", {}, (i, 2 * i, 1, 1))
               for i in range(3 * stats_mod.MAX_TALLIES)]
    for t in tallies:
        s.count(t, 0.5)
        s.count(t, 0.5)
    assert len(s._tallies) <= stats_mod.MAX_TALLIES
    assert s.bytes_sent == 2 * sum(range(len(tallies)))
    assert s.per_collective["all_to_all_single"]["calls"] == 2 * len(tallies)
    assert s.msgs_recv == 2 * len(tallies)
