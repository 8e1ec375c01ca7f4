"""fully_shard's prefetch and reshard_after_forward=k.

Prefetch: the order of collectives and computes in a step of three units (a log that
the collectives' observer hook and the units' forwards write into) is the one FSDP2's
prefetch gives: unit i+1's all-gather is issued before unit i computes in forward, and
unit i-1's before unit i recomputes in backward, and the last unit's before the root's
head computes its backward (the root's pre-backward); the trained parameters are the same
bits with prefetch as without, and with an explicit prefetch list. The trace's span of
each unit's wait says whether its gather was prefetched.

reshard_after_forward=2 on 4 ranks: backward's all-gathers run in groups of 2 (forward's
in the 4), each rank holds its piece for a group of 2 from forward to backward (then
nothing), and training gives one process's parameters (float64, 1e-12), bit for bit
those of reshard_after_forward=True. A size that does not divide the mesh is refused.
"""
import os
import shutil
import tempfile

import numpy as np
import pytest

from minidist import backend
from minidist.trace.merge import read_part
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 3])
TOL = 1e-12
BATCH = 12         # divisible by every world size here
LOG: list = []


class _Observer:
    """Writes every collective issued into LOG (the hook CommDebugMode uses)."""

    def record(self, name, phase, group_size, nbytes):
        LOG.append((name, group_size, nbytes))


def _unit_chain(widths, head=None):
    """A root of Linears, each its own unit, each noting its compute; parameterless, or
    with a head of its own (Linear(widths[-1], head)) whose backward notes
    ("compute", "head backward")."""
    from minidist.autograd.function import Function
    from minidist.nn import Linear, Module, ModuleList

    class NoteBackward(Function):
        """y = x; backward notes that the head's backward runs."""
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            LOG.append(("compute", "head backward"))
            return grad

    class Noted(Linear):
        def forward(self, x):
            LOG.append(("compute", self.index))
            return super().forward(x)

    class Chain(Module):
        def __init__(self):
            super().__init__()
            self.layers = ModuleList([Noted(a, b, dtype="float64")
                                      for a, b in zip(widths, widths[1:])])
            for i, layer in enumerate(self.layers):
                layer.index = i
            if head is not None:
                self.head = Linear(widths[-1], head, dtype="float64")

        def forward(self, x):
            for layer in self.layers:
                x = layer(x).tanh()
            return x if head is None else NoteBackward.apply(self.head(x))
    return Chain()


def _logged_step(prefetch=True, head=None):
    """The log of one step of _unit_chain(widths, head) under fully_shard per layer and at
    the root, collectives named by unit: ('AG', i) / ('RS', i) / ('C', i), with 'backward'
    where backward begins ("root" for the root's own collectives); and the trace's spans
    of the units' gathers, (name, prefetched)."""
    import minidist.distributed as dist
    from minidist.autograd.tensor import Tensor
    from minidist.distributed.fsdp import fully_shard
    from minidist.distributed.tensor import _collectives
    from minidist.trace import recorder as trace
    n = dist.get_world_size()
    backend.manual_seed(0)
    widths = [3, 4, 6, 8]
    model = _unit_chain(widths, head)
    for layer in model.layers:
        fully_shard(layer)
        if not prefetch:
            layer.set_modules_to_forward_prefetch([])
            layer.set_modules_to_backward_prefetch([])
    fully_shard(model)
    # a unit's bytes in: its pieces (ceil(rows / n) rows of weight and bias), float64
    ag = {8 * -(-b // n) * (a + 1): i for i, (a, b) in enumerate(zip(widths, widths[1:]))}
    if head is not None:
        ag[8 * -(-head // n) * (widths[-1] + 1)] = "root"
    x = Tensor(backend.from_host(np.linspace(-1, 1, 2 * 3).reshape(2, 3)))
    LOG.clear()
    observer = _Observer()
    _collectives.OBSERVED.modes.append(observer)
    folder = tempfile.mkdtemp()
    rec = trace.start(os.path.join(folder, "step.json"))
    try:
        loss = model(x).sum()
        LOG.append("backward")
        loss.backward()
    finally:
        _collectives.OBSERVED.modes.remove(observer)
        trace.stop()
    events, _ = read_part(rec.part)
    shutil.rmtree(folder)
    spans = [(e["name"], e["args"]["prefetched"]) for e in events
             if e.get("name", "").startswith("FSDP gather")]
    named = []
    for event in LOG:
        if event == "backward" or event[0] == "compute":
            named.append(event if event == "backward" else ("C", event[1]))
        elif event[0] == "all_gather_into_tensor":
            named.append(("AG", ag[event[2]]))
        else:
            named.append(("RS", ag[event[2] // n]))
    return named, spans


def order_case(prefetch):
    """One step of a parameterless root of three units (_logged_step)."""
    return _logged_step(prefetch)


def test_prefetch_issues_the_next_units_gather_before_this_unit_computes(world):
    AG, RS, C = (lambda i, k=k: (k, i) for k in ("AG", "RS", "C"))
    with_prefetch = [AG(0), AG(1), C(0), AG(2), C(1), C(2), "backward",
                     AG(2), AG(1), C(2), RS(2), AG(0), C(1), RS(1), C(0), RS(0)]
    without = [AG(0), C(0), AG(1), C(1), AG(2), C(2), "backward",
               AG(2), C(2), RS(2), AG(1), C(1), RS(1), AG(0), C(0), RS(0)]
    waits = [f"FSDP gather unit {i} ({phase})" for phase, units in
             (("forward", (0, 1, 2)), ("backward", (2, 1, 0))) for i in units]
    for log, spans in world.run(order_case, True):
        assert log == with_prefetch
        # the trace's spans: the first unit of each direction waited for its own gather
        assert spans == list(zip(waits, [False, True, True, False, True, True]))
    for log, spans in world.run(order_case, False):
        assert log == without
        assert spans == list(zip(waits, [False] * 6))


def root_order_case():
    """One step of a root that holds a head of its own, applied after its three units:
    the backward's log and the units' backward gathers (_logged_step)."""
    named, spans = _logged_step(head=5)
    return (named[named.index("backward") + 1:],
            [span for span in spans if "(backward)" in span[0]])


def test_the_root_prefetches_the_last_units_gather_before_the_heads_backward(world):
    """FSDP2's pre-backward of the root (which kept its parameters): the first gradient to
    reach its output issues the last unit's gather, which then travels while the head's
    backward computes; that unit's wait is a prefetched one."""
    AG, RS, C = (lambda i, k=k: (k, i) for k in ("AG", "RS", "C"))
    backward = [AG(2), C("head backward"), AG(1), C(2), RS(2), AG(0), C(1), RS(1), C(0),
                RS(0), RS("root")]
    for log, spans in world.run(root_order_case):
        assert log == backward
        assert spans == [(f"FSDP gather unit {i} (backward)", True) for i in (3, 2, 1)]


def training_case(case):
    """Two AdamW steps of a GPT under fully_shard: ``case["mode"]`` is "default" (implicit
    prefetch), "off" (none) or "two_ahead" (each unit prefetches the next two in forward)."""
    import minidist.distributed as dist
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    n, r = dist.get_world_size(), dist.get_rank()
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=3, n_head=2, n_embd=8,
                    dtype="float64", seed=case["seed"])
    model = GPT(cfg)
    blocks = list(model.blocks)
    for block in blocks:
        fully_shard(block, reshard_after_forward=case.get("reshard", True))
    fully_shard(model)
    if case["mode"] == "off":
        for m in blocks + [model]:
            m.set_modules_to_forward_prefetch([])
            m.set_modules_to_backward_prefetch([])
    elif case["mode"] == "two_ahead":
        model.set_modules_to_forward_prefetch(blocks[:2])
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - 2):i][::-1])
    opt = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(case["seed"])
    per = BATCH // n
    for _ in range(2):
        idx, tgt = rng.integers(0, 11, (BATCH, 8)), rng.integers(0, 11, (BATCH, 8))
        _, loss = model(*(backend.from_host(a[r * per:(r + 1) * per]) for a in (idx, tgt)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: backend.to_host(d.full_tensor().data)
            for k, d in sharded_state_dict(model).items()}


def test_prefetch_leaves_the_trained_parameters_bit_for_bit_the_same(world):
    runs = {mode: world.run(training_case, dict(mode=mode, seed=4))
            for mode in ("off", "default", "two_ahead")}
    for mode in ("default", "two_ahead"):
        for ours, theirs in zip(runs[mode], runs["off"]):
            for name, value in ours.items():
                assert value.tobytes() == theirs[name].tobytes(), (mode, name)


def single_process(seed):
    """The same two steps on one process, the whole batch (the oracle)."""
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=3, n_head=2, n_embd=8,
                    dtype="float64", seed=seed)
    model = GPT(cfg)
    opt = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(seed)
    for _ in range(2):
        idx, tgt = rng.integers(0, 11, (BATCH, 8)), rng.integers(0, 11, (BATCH, 8))
        _, loss = model(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: backend.to_host(p.data) for k, p in model.named_parameters()}


def reshard_to_node_case(seed):
    """Group sizes of the gathers in one step with reshard_after_forward=2, then training."""
    from minidist.distributed.fsdp import fully_shard
    from minidist.distributed.tensor import _collectives
    from minidist.nn import GPT, GPTConfig
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                    dtype="float64", seed=seed)
    model = GPT(cfg)
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=2)
    fully_shard(model)
    LOG.clear()
    observer = _Observer()
    _collectives.OBSERVED.modes.append(observer)
    try:
        _, loss = model(backend.from_host(np.zeros((1, 8), dtype="int64")),
                        backend.from_host(np.ones((1, 8), dtype="int64")))
        states = [block.__dict__["_fsdp_state"] for block in model.blocks]
        # held from forward to backward: each parameter's piece for a group of 2
        held = [[(tuple(p.shape), param.shape) for p, param in zip(s.post_forward, s.params)]
                for s in states]
        LOG.append("backward")
        loss.backward()
    finally:
        _collectives.OBSERVED.modes.remove(observer)
    split = LOG.index("backward")
    sizes = ([(name, size) for name, size, _ in LOG[:split]],
             [(name, size) for name, size, _ in LOG[split + 1:]])
    freed = all(s.post_forward is None for s in states)
    return sizes, held, freed, training_case(dict(mode="default", seed=seed, reshard=2)), \
        training_case(dict(mode="default", seed=seed, reshard=True))


def refused_size_case(size):
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import Linear
    try:
        fully_shard(Linear(4, 4), reshard_after_forward=size)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def refused_prefetch_case():
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import Linear
    unit = fully_shard(Linear(4, 4))
    try:
        unit.set_modules_to_forward_prefetch([Linear(2, 2)])
    except ValueError as e:
        return str(e)
    return None


def sub_mesh_groups_case():
    """post_forward_group on the dp slices of a 2 x 2 mesh (each rank's mesh differs):
    blocks of 1 and of 2 of its own slice."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp.state import post_forward_group
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("dp", "tp"))["dp"]
    group = mesh.get_group(0)
    return list(mesh.mesh), post_forward_group(group, 1).ranks, post_forward_group(group, 2).ranks


@pytest.fixture(scope="module")
def world4():
    from tests.distributed.worlds import Restarting
    w = Restarting(4)
    yield w
    w.close()


def test_reshard_after_forward_to_a_node_gathers_backward_within_it(world4):
    single = single_process(7)
    for rank, ((forward, backward), held, freed, node, full) in enumerate(
            world4.run(reshard_to_node_case, 7)):
        assert forward == [("all_gather_into_tensor", 4)] * 3     # root and 2 blocks
        for unit in held:                    # torch.chunk's piece for rank % 2 of 2
            for piece, shape in unit:
                c = -(-shape[0] // 2)
                assert piece == (min(c, shape[0] - (rank % 2) * c),) + shape[1:]
        assert freed
        assert backward == [("all_gather_into_tensor", 2)] * 2 + \
            [("reduce_scatter_tensor", 4)] * 3
        for name, value in node.items():
            np.testing.assert_allclose(value, single[name], rtol=TOL, atol=TOL, err_msg=name)
            assert value.tobytes() == full[name].tobytes(), name
    for message in world4.run(refused_size_case, 3):
        assert "must divide the 4 ranks" in message
    for message in world4.run(refused_size_case, 2.0):
        assert "True, False, or an int" in message
    for message in world4.run(refused_prefetch_case):
        assert "takes modules that fully_shard has wrapped" in message
    for rank, (dp, ones, twos) in enumerate(world4.run(sub_mesh_groups_case)):
        assert ones == [rank] and twos == dp and rank in dp and len(dp) == 2
