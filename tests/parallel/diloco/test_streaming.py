"""Streaming DiLoCo (fragments in turn, delay tau, mixing alpha, quantised outer
gradients) equals its one-process simulation, and the schedule is the one stated."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm import World
from minidist.parallel.diloco import fragment_starting_at

from parallel.diloco.diloco_cases import LAYERS, case_of, simulate, train_on_rank
from parallel.diloco.test_diloco import assert_close


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=120.0)
    yield w
    w.close()


@st.composite
def streaming_cases(draw):
    F = draw(st.sampled_from([2, 3]))
    H = F * draw(st.integers(1, 3))
    tau = draw(st.integers(0, min(1, H // F - 1)))
    return dict(F=F, H=H, tau=tau, alpha=draw(st.sampled_from([0.0, 0.5, 0.25])),
                fmt=draw(st.sampled_from([None, "bf16", "e4m3fn", "e5m2", "e2m1fn", "e3m0"])),
                seed=draw(st.integers(0, 2**16)), steps=2 * H + 2)


def merges(case):
    """{inner step t: fragment merged after it}, from the stated rule."""
    out = {}
    for s in range(1, case["steps"] + 1):
        f = fragment_starting_at(s, case["H"], case["F"])
        if f is not None and s + case["tau"] <= case["steps"]:
            out[s + case["tau"]] = f
    return out


@settings(max_examples=8, deadline=None)
@given(drawn=streaming_cases())
def test_streaming_diloco_matches_its_one_process_simulation(world, drawn):
    case = case_of(world=world.world_size, **drawn)
    got = world.run(train_on_rank, case)
    want = simulate(case)
    for step in range(case["steps"]):
        for rank in range(world.world_size):
            assert_close(got[rank][step], want[step][rank])
    if case["alpha"] == 0.0:     # a merged fragment is bitwise the same on every replica
        cuts = np.array_split(np.arange(len(LAYERS)), case["F"])
        for t, f in merges(case).items():
            names = [n for n in got[0][t - 1] if n.split(".")[0] in
                     [LAYERS[i] for i in cuts[f]]]
            for rank in range(1, world.world_size):
                for n in names:
                    assert np.array_equal(got[rank][t - 1][n], got[0][t - 1][n]), (t, n)


def test_fragments_start_h_over_f_apart_the_last_at_multiples_of_h():
    starts = [fragment_starting_at(t, 6, 3) for t in range(1, 13)]
    assert starts == [None, 0, None, 1, None, 2] * 2
    assert [fragment_starting_at(t, 3, 1) for t in range(1, 7)] == [None, None, 0] * 2


def test_one_fragment_given_as_a_list_is_plain_diloco(world):
    case = case_of(world=world.world_size, seed=11, H=2, steps=5, as_fragments=True)
    plain = world.run(train_on_rank, dict(case, as_fragments=False))
    listed = world.run(train_on_rank, case)
    for a, b in zip(plain, listed):
        for sa, sb in zip(a, b):
            for n in sa:
                assert np.array_equal(sa[n], sb[n])


def test_trace_shows_each_fragment_sync_overlapping_the_next_inner_steps(tmp_path):
    from minidist import trace
    path = str(tmp_path / "run.json.gz")
    case = case_of(world=2, seed=1, F=2, H=4, tau=1, alpha=0.5, steps=8)
    with trace.record(path):
        with World(2, timeout=20.0, run_timeout=120.0) as w:
            w.run(train_on_rank, case)
    events = trace.load(path)["traceEvents"]
    syncs = [e for e in events if e.get("ph") == "X" and e["name"].startswith("DiLoCo fragment")]
    steps = [e for e in events if e.get("ph") == "X" and e["name"] == "AdamW.step"]
    assert sorted({e["name"] for e in syncs}) == ["DiLoCo fragment 0 sync",
                                                  "DiLoCo fragment 1 sync"]
    # 2 ranks x the syncs started at steps 2, 4, 6 (merged at 3, 5, 7; step 8's is not
    # merged before the run ends)
    assert len(syncs) == 2 * 3
    for s in syncs:                          # an inner step of the same rank ran inside it
        assert any(st["pid"] == s["pid"] and s["ts"] < st["ts"] < s["ts"] + s["dur"]
                   for st in steps)


def wire_bytes_case(fmt):
    """Two DiLoCo syncs (H = 2, 4 steps) of the float64 test net: the bytes this rank
    sent in the outer gradients' collectives, and the net's number of values."""
    import minidist.distributed as dist
    case = case_of(world=dist.get_world_size(), seed=2, H=2, steps=4, fmt=fmt)
    before = dict(dist.get_stats().per_collective)
    train_on_rank(case)
    after = dist.get_stats().per_collective
    name = "all_reduce" if fmt is None else "all_gather"
    sent = after[name]["bytes_sent"] - before.get(name, {}).get("bytes_sent", 0)
    return sent, 3 * 4 + 4 * 4 + 4 * 2 + 4 + 4 + 2        # the 3 layers' weights and biases


@pytest.mark.parametrize("fmt, bits", [("bf16", 16), ("e4m3fn", 8), ("e3m0", 4)])
def test_quantised_outer_gradients_send_their_bits_on_the_wire(world, fmt, bits):
    """Per sync and rank, an all-gather of (N-1) * (ceil(n * bits / 8) + 4 per tensor)
    bytes; at N = 2 that is bits / 64 (and 4 bytes a tensor) of the float64 all-reduce's
    8 n, which the same run without a format sends."""
    n_ranks = world.world_size
    full = world.run(wire_bytes_case, None)
    for (sent, n), (sent_full, _) in zip(world.run(wire_bytes_case, fmt), full):
        assert sent == 2 * (n_ranks - 1) * (-(-n * bits // 8) + 4 * 6)
        if n_ranks == 2:
            assert sent_full == 2 * 8 * n
