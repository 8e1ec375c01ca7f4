"""3D parallelism takes a LlamaConfig as it takes a GPTConfig: a dp x tp x pp mesh on 2 or
4 processes trains a GQA Llama to the parameters of one process (float64, 1e-12), each
rank comparing its shards with the slices of the dense result. Drawn: the mesh, the
GQA ratio (the tp group divides the key/value heads), the schedule, micro-batches,
sequence parallelism, tied embeddings and global-norm clipping; 2 x 2 x 1 and 2 x 1 x 2
always run, and 1 x 2 x 2 clipped (every step's norm is over the tp slices and the pp
stages, as one process's over the whole model)."""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.comm import DeviceMesh
from minidist.nn import Llama, LlamaConfig
from minidist.optim import AdamW, clip_grad_norm_
from minidist.parallel.three_d import ThreeDParallelGPT
from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture(timeout=30.0, run_timeout=120.0)   # a world per drawn size

STEPS, T = 2, 4
MAX_NORM = 0.05   # below every step's gradient norm here: each step is clipped


def _config(case):
    return LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=case["kv"],
                       tie_word_embeddings=case["tie"], max_position_embeddings=T,
                       dtype="float64", seed=case["seed"])


def _batches(case):
    rng = np.random.default_rng(case["seed"])
    rows = case["dp"] * case["microbatches"] * 2
    return [(rng.integers(0, 12, (rows, T)), rng.integers(0, 12, (rows, T)))
            for _ in range(STEPS)]


def train_3d(case, dense_final):
    mesh = DeviceMesh(dp=case["dp"], pp=case["pp"], tp=case["tp"])
    model = ThreeDParallelGPT(_config(case), mesh, case["microbatches"], case["schedule"],
                              sequence_parallel=case["sp"],
                              max_grad_norm=MAX_NORM if case["clip"] else None)
    opt = AdamW(model.parameters(), lr=0.01)
    for idx, tgt in _batches(case):
        model.train_step(backend.from_host(idx), backend.from_host(tgt), opt)
    want = model.shard_of({n: backend.from_host(a) for n, a in dense_final.items()})
    got = model.named_parameters()
    return max(float(np.abs(backend.to_host(got[n].data) - backend.to_host(want[n])).max())
               for n in got)


def train_single(case):
    model = Llama(_config(case))
    opt = AdamW(model.parameters(), lr=0.01)
    for idx, tgt in _batches(case):
        _, loss = model(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        if case["clip"]:
            clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(q.data) for n, q in model.named_parameters()}


MESHES = [(2, 2, 1), (2, 1, 2), (1, 2, 2), (1, 2, 1), (2, 1, 1), (1, 1, 2)]   # dp, tp, pp


@settings(max_examples=1, deadline=None)
@given(mesh=st.sampled_from(MESHES), kv=st.sampled_from([1, 2, 4]),
       schedule=st.sampled_from(["gpipe", "1f1b"]), microbatches=st.sampled_from([1, 2]),
       tie=st.booleans(), sp=st.booleans(), clip=st.booleans(), seed=st.integers(0, 100))
@example(mesh=(2, 2, 1), kv=2, schedule="1f1b", microbatches=2, tie=True, sp=True, clip=False,
         seed=3)
@example(mesh=(2, 1, 2), kv=2, schedule="1f1b", microbatches=2, tie=False, sp=False, clip=False,
         seed=3)
@example(mesh=(1, 2, 2), kv=2, schedule="1f1b", microbatches=2, tie=True, sp=False, clip=True,
         seed=3)
def test_3d_trains_a_llama_as_one_process(worlds, mesh, kv, schedule, microbatches, tie, sp,
                                          clip, seed):
    dp, tp, pp = mesh
    kv = max(kv, tp)                         # the tp group must divide the kv heads
    case = dict(dp=dp, tp=tp, pp=pp, kv=kv, schedule=schedule, microbatches=microbatches,
                tie=tie, sp=sp and tp > 1, clip=clip, seed=seed)
    dense = train_single(case)
    for err in worlds(dp * tp * pp).run(train_3d, case, dense):
        assert err <= 1e-12, (case, err)
