"""A traced composed step names the mesh dimension of every collective: each span of a
call on a group a device mesh made carries ``mesh_dim`` ("tp", "cp", "pp", "ep",
"dp_shard_cp", ...), and that group's ranks are the mesh's for that name on that rank.

One world of 8 ranks trains a small MoE Llama one step under pp=2 x cp=2 x tp=2 with
ep=2 (borrowing cp) and FSDP over dp_shard_cp (= cp here): every dimension of the mesh
communicates. ``summarize`` then adds the bytes each rank sent per mesh dimension.
"""
import pytest

from minidist import trace
from minidist.comm import World
from minidist.trace.summary import render, summarize

NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "ep",
         "dp_mod_ep")
DEGREES = dict(cp=2, tp=2, pp=2, ep=2)


def composed_step():
    """Every rank: one training step; returns {mesh dim name: its group's ranks}."""
    from minidist import backend
    from minidist.nn import Llama, LlamaConfig
    from minidist.optim import SGD
    from minidist.parallel import parallelize_llama
    from minidist.parallel.compose.parallel_dims import ParallelDims
    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                      num_experts_per_tok=2, router_aux_loss_coef=0.02,
                      max_position_embeddings=8, dtype="float64", tie_word_embeddings=False)
    dims = ParallelDims(**DEGREES)
    mesh = dims.build_mesh()
    model = parallelize_llama(Llama(cfg), mesh, dims)
    gen = backend.Generator(0)
    idx, tgt = gen.integers(0, 16, (2, 8)), gen.integers(0, 16, (2, 8))
    model.train_step(idx, tgt, SGD(model.parameters(), lr=0.1))
    return {name: list(mesh.get_group(name).ranks) for name in NAMES}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mesh_trace") / "run.json")
    with trace.record(path):
        with World(8, timeout=60.0, run_timeout=240.0) as world:
            groups = world.run(composed_step)
    return trace.load(path), groups


def _calls(t):
    """The spans of communication calls on groups of more than one rank."""
    return [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "comm"
            and len(e["args"].get("group", [])) > 1]


def test_every_call_of_a_composed_step_is_labelled_with_its_mesh_dimension(traced):
    t, groups = traced
    calls = _calls(t)
    assert calls and all("mesh_dim" in e["args"] for e in calls), \
        {e["name"] for e in calls if "mesh_dim" not in e["args"]}
    seen = {e["args"]["mesh_dim"] for e in calls}
    assert {"pp", "cp", "tp", "ep", "dp_shard_cp"} <= seen
    for e in calls:                      # the label is the mesh's group for that name
        assert e["args"]["group"] == groups[e["pid"]][e["args"]["mesh_dim"]]


def test_each_strategys_calls_run_on_its_own_dimension(traced):
    """Stage-to-stage messages on pp, ring attention's K/V blocks on cp, the experts'
    all-to-alls on ep, FSDP's gathers and reduce-scatters on dp_shard_cp, Megatron's
    all-reduces on tp (the loss shown on dp_cp, the routers' counts on cp)."""
    t, _ = traced
    dims = {}
    for e in _calls(t):
        dims.setdefault(e["name"], set()).add(e["args"]["mesh_dim"])
    assert dims["recv"] == {"pp"} and dims["irecv"] == {"cp"}
    assert dims["all_to_all_single"] == {"ep"}
    assert dims["all_gather"] == dims["reduce_scatter"] == {"dp_shard_cp"}
    assert {"tp", "cp", "dp_cp", "pp"} <= dims["all_reduce"]


def test_the_summary_gives_each_ranks_bytes_per_mesh_dimension(traced):
    t, _ = traced
    summary = summarize(t)
    by_dim = summary["bytes_by_mesh_dim"]
    sent = {}
    for e in _calls(t):
        key = (e["args"]["mesh_dim"], e["pid"])
        sent[key] = sent.get(key, 0) + e["args"].get("bytes_sent", 0)
    assert by_dim == {dim: {pid: b for (d, pid), b in sent.items() if d == dim}
                      for dim in {d for d, _ in sent}}
    text = render(summary)
    assert "bytes sent per rank, by mesh dimension" in text and "\n  tp " in text
