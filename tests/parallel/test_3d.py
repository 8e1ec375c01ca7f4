"""3D parallelism: dp=2 x pp=2 x tp=2 on 8 processes trains the GPT as one process does
(and clips its gradients as one process does).

One 8-rank world (slow to start on a small machine, so one test module, two
configurations). The parent trains the dense GPT for k SGD steps on the whole
batches; every rank trains its share with data, pipeline and tensor parallelism
at once and compares its parameter shards with the matching slices of the
parent's result: float64, within 1e-12 (sums are reordered, nothing else).
"""
import numpy as np
import pytest

from minidist import backend
from minidist.comm import DeviceMesh, World
from minidist.nn import GPT, GPTConfig
from minidist.optim import SGD, clip_grad_norm_
from minidist.parallel.three_d import ThreeDParallelGPT

TOL = 1e-12
STEPS, LR = 3, 0.5


def _config(case):
    return GPTConfig(block_size=4, vocab_size=12, n_layer=2 * case["virtual"], n_head=2,
                     n_embd=8, tie_weights=case["tie"], dtype="float64", seed=5)


def _batches(case, cfg):
    rng = np.random.default_rng(7)
    rows = 2 * case["microbatches"] * 2          # dp x m x 2 rows per micro-batch
    return [(rng.integers(0, cfg.vocab_size, (rows, cfg.block_size)),
             rng.integers(0, cfg.vocab_size, (rows, cfg.block_size))) for _ in range(STEPS)]


def train_3d(case, dense_final):
    """Every rank: k steps of 3D-parallel training -> max |shard - dense slice|."""
    cfg = _config(case)
    mesh = DeviceMesh(dp=2, pp=2, tp=2)
    model = ThreeDParallelGPT(cfg, mesh, case["microbatches"], case["schedule"],
                              case["virtual"], case["sp"])
    opt = SGD(model.parameters(), lr=LR)
    losses = []
    for idx, tgt in _batches(case, cfg):
        losses.append(model.train_step(backend.from_host(idx), backend.from_host(tgt), opt))
    want = model.shard_of({n: backend.from_host(a) for n, a in dense_final.items()})
    got = model.named_parameters()
    err = max(float(np.abs(backend.to_host(got[n].data) - backend.to_host(want[n])).max())
              for n in got)
    return err, sorted(got), losses


def train_single(case):
    cfg = _config(case)
    model = GPT(cfg)
    opt = SGD(model.parameters(), lr=LR)
    for idx, tgt in _batches(case, cfg):
        _, loss = model(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(q.data) for n, q in model.named_parameters()}


@pytest.fixture(scope="module")
def world8():
    w = World(8, timeout=30.0, run_timeout=120.0)
    yield w
    w.close()


@pytest.mark.parametrize("case", [
    dict(schedule="1f1b", microbatches=2, virtual=1, tie=True, sp=False),
    dict(schedule="interleaved", microbatches=2, virtual=2, tie=False, sp=True),
    dict(schedule="zb_v", microbatches=2, virtual=2, tie=True, sp=False),   # 4 layers, a V
], ids=["1f1b-tied", "interleaved-sequence-parallel", "zb_v-tied"])
def test_3d_parameters_after_k_steps_equal_single_process(world8, case):
    dense = train_single(case)
    results = world8.run(train_3d, case, dense)
    for err, _, _ in results:
        assert err <= TOL, (case, err)
    # every parameter of the model is trained by some rank
    assert set().union(*(names for _, names, _ in results)) == set(dense)


MAX_NORM = 0.05   # below every step's gradient norm here: each step is clipped


def train_3d_clipped(case, dense_final):
    """Every rank: k clipped steps -> (max |shard - dense slice|, the norm of each step)."""
    cfg = _config(case)
    model = ThreeDParallelGPT(cfg, DeviceMesh(dp=2, pp=2, tp=2), case["microbatches"],
                              case["schedule"], case["virtual"], case["sp"],
                              max_grad_norm=MAX_NORM)
    opt = SGD(model.parameters(), lr=LR)
    norms = []
    for idx, tgt in _batches(case, cfg):
        model.train_step(backend.from_host(idx), backend.from_host(tgt), opt)
        norms.append(model.last_grad_norm)
    want = model.shard_of({n: backend.from_host(a) for n, a in dense_final.items()})
    got = model.named_parameters()
    err = max(float(np.abs(backend.to_host(got[n].data) - backend.to_host(want[n])).max())
              for n in got)
    return err, norms


def train_single_clipped(case):
    cfg = _config(case)
    model = GPT(cfg)
    opt = SGD(model.parameters(), lr=LR)
    norms = []
    for idx, tgt in _batches(case, cfg):
        _, loss = model(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        norms.append(clip_grad_norm_(model.parameters(), MAX_NORM))
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(q.data) for n, q in model.named_parameters()}, norms


def test_3d_clipped_steps_equal_single_process_clipped_steps(world8):
    """Global-norm clipping over tp x pp (replicated parameters on tp rank 0, the tied
    embedding on the first stage), nothing over dp: the one-process clipped steps."""
    case = dict(schedule="1f1b", microbatches=2, virtual=1, tie=True, sp=True)
    dense, norms = train_single_clipped(case)
    assert min(norms) > MAX_NORM                 # every step clipped
    for err, got in world8.run(train_3d_clipped, case, dense):
        assert err <= TOL, err
        assert np.allclose(got, norms, rtol=TOL, atol=0), (got, norms)
