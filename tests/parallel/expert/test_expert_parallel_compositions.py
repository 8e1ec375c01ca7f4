"""Expert parallelism under the data-parallel wrappers that treat their ranks as copies:
DDP (bucketed and naive), ZeRO (1, 2, 3) and fully_shard over the ranks that hold
different experts refuse, with
an error naming the parameter, the cause and the fix, instead of broadcasting rank 0's
experts over the others' and averaging different experts' gradients. A ZeRO or
fully_shard group that holds the same experts (ExpertMesh.dp_group) is accepted."""
import pytest

from minidist.comm import RankFailedError
from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()


def _expert_parallel_model(kind):
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    if kind == "gpt":
        model = GPT(GPTConfig(block_size=4, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                              moe_every=1, n_expert=4, moe_aux_coef=0.0, dtype="float64"))
    else:
        model = Llama(LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=8,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=1, num_local_experts=4,
                                  dtype="float64"))
    return model


def wrap(kind, strategy):
    """An expert-parallel model over the world, then ``strategy`` over the world too."""
    import minidist.distributed as dist
    from minidist.distributed.fsdp import fully_shard
    from minidist.optim import AdamW
    from minidist.parallel import Zero1, Zero2, Zero3
    from minidist.parallel.data import DataParallelNaive, DistributedDataParallel
    from minidist.parallel.expert import ExpertMesh, expert_parallel
    model = expert_parallel(_expert_parallel_model(kind), ExpertMesh(ep=dist.get_world_size()))
    if strategy == "fully_shard":
        for block in model.blocks:
            fully_shard(block)
    elif strategy in ("ddp", "ddp_naive"):
        {"ddp": DistributedDataParallel, "ddp_naive": DataParallelNaive}[strategy](model)
    else:
        {"zero1": Zero1, "zero2": Zero2, "zero3": Zero3}[strategy](model, AdamW)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_naive", "zero1", "zero2", "zero3",
                                      "fully_shard"])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_expert_parallel_under_a_wrapper_over_its_own_ranks_is_refused(worlds, strategy, kind):
    with pytest.raises(RankFailedError, match=r"(?s)different tensors.*ExpertMesh.dp_group"):
        worlds(2).run(wrap, kind, strategy)


@pytest.mark.parametrize("model", ["gpt", "moe_llama"])
@pytest.mark.parametrize("feature", ["lamb", "lars", "fp8"])
def test_expert_parallel_trust_ratios_and_fp8_amaxes_are_each_experts_own(worlds, model,
                                                                           feature):
    """Taken over the expert-parallel group (as pieces of one tensor) they summed other
    experts' norms (LAMB 7e-5, LARS 5e-4 from one process) and max-combined other
    experts' amaxes (FP8: 8e-2)."""
    import numpy as np

    from tests.parallel.compositions.recipe import Case, train
    from tests.parallel.compositions.strategies import run_case
    case = Case("expert", model, feature, seed=4)
    want = train(case)
    for rank, params in enumerate(worlds(2).run(run_case, case)):
        assert any(".experts." in name for name in params), params.keys()
        for name, value in params.items():
            diff = np.abs(value - want[name]).max()
            assert diff <= 1e-12, f"rank {rank} {name}: {diff:.2e}; {case}"
