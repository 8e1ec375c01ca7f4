"""DualPipeV's F&B on an MoE Llama with expert parallelism: the forward half of one
micro-batch and the backward half of another take turns at each expert all-to-all
(comm/collectives/interleave.py), so one's dispatch and combine travel while the other
computes. Checked: the pipeline (pp = 2 x ep = 2, ep borrowed from dp_shard) trains to
one process's parameters (float64, 1e-12); the interleaved F&B equals the plain one
(forward, then backward) bit for bit; and the trace shows an all-to-all of one half in
flight during the other half's compute."""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import worlds_fixture
from tests.parallel.test_parallelize import _batches, _case, _check, _config

worlds = worlds_fixture(timeout=30.0, run_timeout=180.0)

PP2_EP2 = dict(dp_shard=2, pp=2, ep=2)     # 4 ranks: ep borrows dp_shard
WORLD = 4


@settings(max_examples=4, deadline=None)
@given(extra=st.sampled_from([0, 1]), checkpoint=st.sampled_from([False, True, "selective"]),
       seed=st.integers(0, 100))
@example(extra=0, checkpoint="selective", seed=1)
def test_dualpipe_v_moe_llama_with_expert_parallelism_trains_as_one_process(
        worlds, extra, checkpoint, seed):
    """Checkpointed too: a backward half's recompute runs all-to-alls, and hands over
    in the middle of it (so "recomputing" is per thread: autograd/recompute.py)."""
    case = _case(PP2_EP2, True, "dualpipe_v", m=4 + extra, clip=True, seed=seed)
    _check(worlds, dict(case, checkpoint=checkpoint))


def _train(case, interleave, path=None):
    """Two steps of the composed model; its parameters (host arrays by name), and the
    trace's events of this rank if ``path``."""
    from minidist import trace
    from minidist.nn import Llama
    from minidist.optim import AdamW
    from minidist.parallel import parallelize_llama
    from minidist.parallel.compose.parallel_dims import ParallelDims
    dims = ParallelDims(**case["dims"])
    model = parallelize_llama(Llama(_config(case)), dims.build_mesh(), dims, case["m"],
                              case["schedule"])
    model.interleave = interleave
    opt = AdamW(model.parameters(), lr=0.01)
    for step, (idx, tgt) in enumerate(_batches(case)):
        if path is not None and step == 1:          # the second step, warmed up
            with trace.record(path):
                model.train_step(backend.from_host(idx), backend.from_host(tgt), opt)
        else:
            model.train_step(backend.from_host(idx), backend.from_host(tgt), opt)
    return {n: backend.to_host(q.data) for n, q in model.named_parameters().items()}


def _plain_and_interleaved(case, folder):
    import os

    import minidist.distributed as dist
    from minidist import trace
    plain = _train(case, interleave=False)
    path = os.path.join(folder, "dualpipe.json")
    turns = _train(case, interleave=True, path=path)
    dist.barrier()
    events = trace.load(path)["traceEvents"] if dist.get_rank() == 0 else None
    return plain, turns, events


def _hidden(events):
    """(pid, turn's name, us) for each turn of an F&B half that began while a background
    all-to-all (one on the comm thread) was in flight, and how long the two overlap.
    That all-to-all is the other half's: a half's own leaves as its turn ends, and its
    next turn begins only once its rows have landed (interleave.hand_over)."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    turns = [e for e in spans if e["cat"] == "turn"]
    a2as = [e for e in spans if e["name"] == "all_to_all_single"
            and names.get((e["pid"], e["tid"]), "").startswith("comm")]
    found = []
    for a in a2as:
        for t in turns:
            if t["pid"] == a["pid"] and a["ts"] < t["ts"] < a["ts"] + a["dur"]:
                both = min(a["ts"] + a["dur"], t["ts"] + t["dur"]) - t["ts"]
                found.append((a["pid"], t["name"], both))
    return found, turns


def test_interleaved_fb_equals_the_plain_fb_bit_for_bit_and_hides_all_to_alls(
        worlds, tmp_path):
    case = _case(PP2_EP2, True, "dualpipe_v", m=4, clip=False, seed=7)
    results = worlds(WORLD).run(_plain_and_interleaved, case, str(tmp_path))
    for plain, turns, _ in results:
        assert plain.keys() == turns.keys()
        for name in plain:
            np.testing.assert_array_equal(turns[name], plain[name], err_msg=name)
    events = results[0][2]
    from minidist.trace.check import check
    assert check({"traceEvents": events}) == []     # the turns on rows of their own
    found, turns = _hidden(events)
    halves = {(t["args"]["microbatch"], t["args"]["half"]) for t in turns}
    assert {h for _, h in halves} == {0, 1}, "no F&B ran as two halves taking turns"
    assert found, "no all-to-all of one half was in flight while the other half computed"
