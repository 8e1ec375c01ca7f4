"""parallelize_module and tied weights: a plan given one holder of a tied Parameter is
refused; at the root it cuts both holders alike and ties them again.

GPT's wte.weight is lm_head.weight (Llama's tie_word_embeddings). Given
``model.lm_head`` alone, ColwiseParallel replaced lm_head.weight by its (V/t, C)
piece while wte.weight stayed the whole (V, C) matrix, without an error: two copies,
each with its half of the gradient, trained apart. World of 2, float64.
"""
import copy

import numpy as np

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
TOL = 1e-12


def _gpt():
    from minidist.nn import GPT, GPTConfig
    return GPT(GPTConfig(block_size=4, vocab_size=12, n_layer=1, n_head=2, n_embd=8,
                         dtype="float64", seed=3))


def _llama():
    from minidist.nn import Llama, LlamaConfig
    return Llama(LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=8,
                             num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, dtype="float64", seed=3,
                             tie_word_embeddings=True))


def split_case(kind, target, plan):
    """parallelize_module on ``target`` (a path in the model) with ``plan``: the error."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor import Replicate
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module)
    model = copy.deepcopy(_gpt() if kind == "gpt" else _llama())
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    styles = {"col": ColwiseParallel(output_layouts=Replicate()),
              "row": RowwiseParallel(input_layouts=Replicate())}
    plan = styles[plan] if isinstance(plan, str) else {k: styles[v] for k, v in plan.items()}
    before = [q.shape for q in model.parameters()]
    try:
        parallelize_module(dict(model.named_modules())[target], mesh["tp"], plan)
    except ValueError as e:
        return str(e), [q.shape for q in model.parameters()] == before
    return None, None


def test_a_plan_on_one_holder_of_a_tied_weight_is_refused(world):
    """The head alone, the embedding alone, or a dict plan on Llama's inner model (which
    holds the embedding, not the head): refused, before anything is cut, naming both
    paths of the tied Parameter and saying to apply the plan at the root."""
    cases = [("gpt", "lm_head", "col", "lm_head.weight", "wte.weight"),
             ("gpt", "wte", "row", "wte.weight", "lm_head.weight"),
             ("llama", "lm_head", "col", "lm_head.weight", "model.embed_tokens.weight"),
             ("llama", "model", {"embed_tokens": "row"}, "model.embed_tokens.weight",
              "lm_head.weight")]
    for kind, target, plan, name, other in cases:
        for message, untouched in world.run(split_case, kind, target, plan):
            assert message is not None, (kind, target)
            assert "tied weights" in message and "at the root" in message, message
            assert f"{name} is {other}" in message, message
            assert untouched, (kind, target)


def root_case(kind):
    """The root plan on a deep copy: the tie held; the loss, and this rank's rows of the
    tied gradient (both halves: embedding and head), as one process's."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import (gpt_tp_plan, llama_tp_plan,
                                                      parallelize_module)
    import minidist.distributed as dist
    single = _gpt() if kind == "gpt" else _llama()
    model = copy.deepcopy(single)
    cfg = model.config
    mesh = init_device_mesh(backend.device_type(), (2,), mesh_dim_names=("tp",))
    plan = gpt_tp_plan(cfg, 2) if kind == "gpt" else llama_tp_plan(cfg, 2)
    parallelize_module(model, mesh["tp"], plan)
    embedding = "wte" if kind == "gpt" else "model.embed_tokens"
    modules = dict(model.named_modules())
    tied = modules[embedding].weight is modules["lm_head"].weight
    rng = np.random.default_rng(0)
    V = cfg.vocab_size
    idx, tgt = (backend.from_host(rng.integers(0, V, (2, 4))) for _ in "ab")
    losses = []
    for m in (single, model):
        _, loss = m(idx, tgt)
        loss.backward()
        losses.append(float(backend.to_host(loss.data)))
    rows = slice(dist.get_rank() * V // 2, (dist.get_rank() + 1) * V // 2)   # my vocabulary
    mine = backend.to_host(modules["lm_head"].weight.grad)
    theirs = backend.to_host(single.lm_head.weight.grad)[rows]
    return tied, abs(losses[0] - losses[1]), float(np.abs(mine - theirs).max())


def test_the_root_plan_cuts_both_holders_and_ties_them_again(world):
    """The plan at the root (GPT and Llama, on a deep copy: the tie's record goes with
    it) is not refused, keeps one Parameter, and computes as one process."""
    for kind in ("gpt", "llama"):
        for tied, loss_err, err in world.run(root_case, kind):
            assert tied, kind
            assert loss_err <= TOL and err <= TOL, (kind, loss_err, err)
