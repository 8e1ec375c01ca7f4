"""bench/bench_overlap.py at a tiny size: every pair runs on the emulated link and prints
its table, with exposed communication read off a trace (for the FSDP gathers, their own
waits), and its verdict lines (the wire time of the traffic the overlap acts on, the old
whole-wire figure beside it). (What the
figures are is the benchmark's to print; no time is asserted here.) And the benchmark's
accounting of that traffic, on a trace made by hand."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import _overlap_traffic  # noqa: E402

TINY = ["--rounds", "1", "--steps", "1", "--trace-steps", "1", "--layers", "1", "--width", "16",
        "--seq", "8", "--batch", "1", "--microbatches", "4"]


def _bench(*argv, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "bench_overlap.py"), *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_bench_overlap_prints_every_pair_with_its_exposed_communication():
    out = _bench(*TINY).stdout
    for pair, overlapped in [("tp", "async TP"), ("pipeline", "DualPipeV"), ("fsdp", "float8"),
                             ("moe", "overlapped"), ("pipeline_ep", "DualPipeV")]:
        assert f"== {pair}:" in out, out
        assert f"  {overlapped} vs " in out and "the wire allows hiding" in out, out
    assert "(pp=2 x ep=2, 4 ranks)" in out and "on pp / ep:" in out, out
    for what in ("the plain variant's TP all-gathers and reduce-scatters:",
                 "its stage sends:", "its stage sends (pp) and the all-to-alls inside its F&B",
                 "the all-gather bytes saved:", "the all-to-alls it starts async:"):
        assert f"(it acts on {what}" in out, out
    assert out.count("the old figure, every call's wire time") == 6, out
    # the gathers' bar reads their own waits, the whole step's exposed time beside it
    assert "exposed in the gathers' waits (FSDP gather unit k spans), per step, median " \
        "over the rounds, at each gather the least over the ranks (the largest rank's " \
        "waits): float32 " in out, out
    assert out.count("  bfloat16 vs float32: gathers' exposed ") == 1, out
    assert "(largest rank's gather waits " in out and ", whole step " in out, out
    assert "CPU floor" in out
    assert "== the bars, one line per overlap" in out, out
    bars = out.split("== the bars")[1]
    for line in ("tp:          async TP vs plain SP:", "pipeline:    DualPipeV vs 1F1B:",
                 "fsdp:        bfloat16 vs float32:", "fsdp:        float8 vs float32:",
                 "moe:         overlapped vs plain dispatch:",
                 "pipeline_ep: DualPipeV vs 1F1B:"):
        assert line in bars, out
    assert out.count("CPU ") >= 3 and ("pays" in out or "nothing saved or hidden" in out), out


def test_bench_overlap_runs_the_expert_parallel_pipeline_alone():
    run = _bench("--only", "pipeline_ep", *TINY)
    assert run.returncode == 0, run.stderr
    assert "== pipeline_ep: 1F1B vs DualPipeV (pp=2 x ep=2, 4 ranks) ==" in run.stdout
    assert "== tp:" not in run.stdout and "pipeline_ep: DualPipeV vs 1F1B:" in run.stdout


def test_bench_overlap_refuses_an_unknown_pair():
    run = _bench("--only", "zero", timeout=60)
    assert run.returncode == 2 and "unknown pair" in run.stderr


def _span(name, pid, tid, ts, dur, cat="comm", **args):
    return dict(ph="X", name=name, cat=cat, pid=pid, tid=tid, ts=ts, dur=dur, args=args)


HAND_MADE = {"traceEvents": [
    _span("F2 c1 & B0", 0, 0, 100, 50, cat="pipeline", kind="F&B"),
    _span("F1", 0, 0, 0, 50, cat="pipeline", kind="F"),
    _span("all_to_all_single", 0, 0, 10, 5, bytes_sent=1000, mesh_dim="ep"),   # in F, blocking
    _span("all_to_all_single", 0, 2, 110, 20, bytes_sent=300, mesh_dim="ep"),  # in F&B, async
    _span("all_to_all_single", 0, 0, 120, 5, bytes_sent=40, mesh_dim="ep"),    # in F&B, blocking
    _span("all_to_all_single", 1, 0, 110, 5, bytes_sent=7),      # rank 1: no F&B of its own
    _span("isend", 0, 0, 60, 1, bytes_sent=4096, mesh_dim="pp", peer=1),
    _span("all_gather", 0, 2, 0, 3, bytes_sent=64, bytes_recv=64, mesh_dim="dp_shard_cp"),
    _span("reduce_scatter", 1, 0, 0, 3, bytes_sent=32),
    _span("wait", 0, 0, 140, 5),
]}


def test_the_traffic_an_overlap_acts_on_is_read_per_kind_thread_and_f_and_b():
    t = _overlap_traffic.traffic_of(HAND_MADE)
    assert t["all"] == {0: 1000 + 300 + 40 + 4096 + 64, 1: 7 + 32}
    assert t["all_to_all"] == {0: 1340, 1: 7}
    assert t["a2a_async"] == {0: 300}
    assert t["a2a_in_fb"] == {0: 340}
    assert t["sends"] == t["pp"] == {0: 4096}
    assert t["ep"] == {0: 1340}
    assert t["all_gather"] == t["gathered"] == {0: 64} and t["reduce_scatter"] == {1: 32}


@pytest.mark.parametrize("pair, expected", [
    ("tp", 64 + 0), ("moe", 300), ("pipeline", 4096), ("pipeline_ep", 4096 + 340)])
def test_each_pair_counts_the_traffic_its_overlap_acts_on_on_the_busiest_rank(pair, expected):
    row = dict(traffic=_overlap_traffic.traffic_of(HAND_MADE))
    acted, what = _overlap_traffic.targeted(pair, row, row)
    assert acted == expected and what


def test_the_waits_own_exposed_time_is_the_least_rank_at_each_wait():
    """Rank 0 came late to the first gather (rank 1 waited 5 for it), rank 1 to the
    second: each gather's own exposure is what the last to arrive waited."""
    ranks = [dict(exposed_in_waits={"FSDP gather": [1, 7], "FSDP reduce-scatter": [9]}),
             dict(exposed_in_waits={"FSDP gather": [6, 2]})]
    assert _overlap_traffic.own_waits(ranks, "FSDP gather") == 1 + 2
    assert _overlap_traffic.own_waits([dict(exposed_in_waits={})], "FSDP gather") == 0


def test_the_low_precision_gathers_are_credited_with_the_bytes_they_save():
    plain = dict(traffic=dict(all_gather={0: 1000, 1: 900}))
    half = dict(traffic=dict(all_gather={0: 500, 1: 450}))
    assert _overlap_traffic.targeted("fsdp", half, plain)[0] == 500
