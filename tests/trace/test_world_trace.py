"""A traced world: the merged file is a valid trace, and what it says agrees with
what the code measured its own way on the same run.

One world of 2 ranks runs inside ``trace.record``: collectives of every kind and
size class (so every algorithm path records), point-to-point calls, DDP steps
with overlap, a pipelined step on the wall clock, a checkpoint write. Then:

- the file follows the Trace Event format (trace/check.py: keys per phase,
  integer pid / tid, every "s" matched by one "f" on the receiving rank, spans
  nested per thread);
- the bytes of the collective spans add up to the bytes ``get_stats`` counted;
- the bubble read off the trace equals ``measured_bubble`` of the same step, and
  DDP's hidden fraction read off the trace equals the bucket timeline's.
"""
import numpy as np
import pytest

import minidist.distributed as dist
from minidist import backend, trace
from minidist.comm import World
from minidist.trace.check import check
from minidist.trace.summary import summarize

TOL = 1e-4   # times are truncated to nanoseconds in the file: a fraction of sums of a
             # few bucket intervals of >= 50 us moves by < 1e-4


def traced_work(tmp):
    from minidist.autograd import Tensor
    from minidist.backend import Generator, xp
    from minidist.checkpoint.io import save_file
    from minidist.nn import Linear, Module, Sequential
    from minidist.optim import SGD
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.pipeline.executor import run_pipeline
    from minidist.parallel.pipeline.schedule import make_schedule
    from minidist.comm.collectives.api import all_reduce
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.get_stats().reset()
    # collectives: small (allgather), large (direct / ring), async, and the rest
    for size in (16, 1 << 16, 1 << 18):
        dist.all_reduce(xp.ones(size, dtype="float32"))
    all_reduce(xp.ones(4096, dtype="float32"), algorithm="ring")
    all_reduce(xp.ones(4096, dtype="float32"), algorithm="tree")
    dist.all_reduce(xp.ones(1000, dtype="float32"), async_op=True).wait()
    dist.broadcast(xp.ones(300, dtype="float64"), 0)
    dist.all_gather_into_tensor(xp.empty(2 * n * 50, dtype="float32"), xp.ones(100, dtype="float32"))
    dist.reduce_scatter_tensor(xp.empty(50, dtype="float32"), xp.ones(50 * n, dtype="float32"))
    dist.all_to_all_single(xp.empty(8 * n, dtype="float32"), xp.ones(8 * n, dtype="float32"))
    dist.barrier()
    stats = dist.get_stats().per_collective
    # point to point
    buf = xp.zeros(64, dtype="float32")
    if rank == 0:
        dist.send(buf, 1)
        dist.isend(buf, 1, tag=3).wait()
    else:
        dist.recv(buf, 0)
        dist.irecv(buf, 0, tag=3).wait()
    # DDP with overlap: 4 buckets of one layer each
    model = Sequential(*[Linear(128, 128, generator=Generator(i)) for i in range(4)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.07)
    opt = SGD(model.parameters(), lr=0.1)
    x = Tensor(Generator(7 + rank).normal((64, 128)))
    for _ in range(2):
        ddp(x).sum().backward()
        opt.step()
        opt.zero_grad()
    # a pipelined step, 1F1B over 4 micro-batches, on the wall clock

    class Piece(Module):
        def __init__(self, last):
            super().__init__()
            self.lin, self.last = Linear(8, 8, generator=Generator(rank)), last

        def forward(self, x, target=None):
            y = self.lin(x if isinstance(x, Tensor) else Tensor(x))
            return (y * y).mean() if self.last else y
    m = 4
    inputs = [Generator(i).normal((2, 8)) for i in range(m)]
    pstats = run_pipeline(make_schedule("1f1b", n, m)[rank], [Piece(rank == n - 1)], m, inputs,
                          [None] * m, activation_shape=(2, 8), dtype="float32")
    save_file(f"{tmp}/ckpt_{rank}.pkl", {"w": model[0].weight.data})
    timeline = [(op.kind, start, end) for op, start, end in pstats.timeline]
    return stats, ddp.timeline[-1]["hidden_fraction"], timeline


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    path = str(tmp / "run.json.gz")
    with trace.record(path):
        with World(2, timeout=30.0, run_timeout=120.0) as world:
            results = world.run(traced_work, str(tmp))
    return trace.load(path), results


def test_merged_trace_follows_the_trace_event_format(traced):
    t, _ = traced
    assert check(t) == []
    names = {e["args"]["name"] for e in t["traceEvents"] if e.get("name") == "process_name"}
    assert {"rank 0", "rank 1"} <= names
    threads = {e["args"]["name"] for e in t["traceEvents"] if e.get("name") == "thread_name"}
    assert "main" in threads and any(name.startswith("comm") for name in threads)
    flows = [e for e in t["traceEvents"] if e["ph"] == "s"]
    assert len(flows) > 20


def test_span_bytes_add_up_to_the_collectives_counts(traced):
    t, results = traced
    for rank, (stats, _, _) in enumerate(results):
        for name, counted in stats.items():
            spans = [e for e in t["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                     and e["name"] == name and e["args"]["group"] == [0, 1]]
            assert len(spans) >= counted["calls"]
            first = spans[:counted["calls"]]    # the ones before the stats were read
            for key in ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv"):
                assert sum(e["args"][key] for e in first) == counted[key], (rank, name, key)


def test_trace_bubble_equals_measured_bubble_of_the_same_step(traced):
    from minidist.parallel.pipeline.executor import measured_bubble
    t, results = traced
    bubbles = summarize(t)["bubbles"]
    assert list(bubbles) == [((0, 1), 0)]
    measured = measured_bubble([_as_stored(timeline) for _, _, timeline in results])
    # 1e-7: the file's microseconds are floats near 1e11, exact to ~1e-5 us; relative
    # too, since that error is divided by the compute time (a loaded machine stretches
    # the idle time, and the bubble, past 20)
    assert bubbles[((0, 1), 0)] == pytest.approx(measured, rel=1e-7, abs=1e-7)


def _as_stored(timeline):
    """The (op, start, end) timeline with each time truncated to the nanosecond, as the
    trace file stores it: the two bubbles then agree to the file's float rounding, however
    short the ops (with a few ms of compute, 1 ns per timestamp moves the bubble by ~1e-5)."""
    return [(op, int(start * 1e9) / 1e9, int(end * 1e9) / 1e9) for op, start, end in timeline]


def test_trace_ddp_hidden_fraction_equals_the_bucket_timelines(traced):
    t, results = traced
    hidden = summarize(t)["ddp_hidden"]
    for rank, (_, fraction, _) in enumerate(results):
        assert hidden[(rank, 1)] == pytest.approx(fraction, abs=TOL)   # the second backward
    buckets = [e for e in t["traceEvents"] if e.get("cat") == "ddp" and e["ph"] == "X"]
    assert len(buckets) == 2 * 2 * 4 and all(e["tid"] != 0 for e in buckets)


def test_modules_optimizer_and_checkpoint_have_spans(traced):
    t, _ = traced
    names = {(e["cat"], e["name"]) for e in t["traceEvents"] if e["ph"] == "X"}
    for want in [("module", "module.0"), ("module", "module.3"), ("module", "module.3 backward"),
                 ("module", "lin backward"), ("optim", "SGD.step"),
                 ("checkpoint", "checkpoint write"), ("pipeline", "F0"), ("pipeline", "B3"),
                 ("comm", "send"), ("comm", "recv"), ("comm", "isend"), ("comm", "irecv")]:
        assert want in names
