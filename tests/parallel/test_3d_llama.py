"""3D parallelism takes a LlamaConfig as it takes a GPTConfig: dp x tp x pp = 2 x 2 x 1 and
2 x 1 x 2 on 4 processes train a GQA Llama to the parameters of one process (float64,
1e-12), each rank comparing its shards with the slices of the dense result."""
import numpy as np
import pytest

from minidist import backend
from minidist.comm import DeviceMesh, World
from minidist.nn import Llama, LlamaConfig
from minidist.optim import AdamW
from minidist.parallel.three_d import ThreeDParallelGPT

STEPS, T = 2, 4


def _config(case):
    return LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=case["tie"], max_position_embeddings=T,
                       dtype="float64", seed=3)


def _batches(case):
    rng = np.random.default_rng(1)
    rows = case["dp"] * case["microbatches"] * 2
    return [(rng.integers(0, 12, (rows, T)), rng.integers(0, 12, (rows, T)))
            for _ in range(STEPS)]


def train_3d(case, dense_final):
    mesh = DeviceMesh(dp=case["dp"], pp=case["pp"], tp=case["tp"])
    model = ThreeDParallelGPT(_config(case), mesh, case["microbatches"], case["schedule"],
                              sequence_parallel=case["sp"])
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
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(q.data) for n, q in model.named_parameters()}


@pytest.fixture(scope="module")
def world4():
    w = World(4, timeout=30.0, run_timeout=120.0)
    yield w
    w.close()


@pytest.mark.parametrize("case", [
    dict(dp=2, tp=2, pp=1, schedule="1f1b", microbatches=2, tie=True, sp=True),
    dict(dp=2, tp=1, pp=2, schedule="1f1b", microbatches=2, tie=False, sp=False),
], ids=["dp2-tp2-sp-tied", "dp2-pp2"])
def test_3d_trains_a_llama_as_one_process(world4, case):
    dense = train_single(case)
    for err in world4.run(train_3d, case, dense):
        assert err <= 1e-12, (case, err)
