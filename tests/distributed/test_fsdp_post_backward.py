"""fully_shard's post-backward: a unit's reduce-scatter is left in flight.

The order of events in the backward of three units (a log that the units' computes and
a wrapper of the reduce-scatter's issue and wait write into): unit k's reduce-scatter is
issued when its backward is done and waited only after unit k-1 has recomputed (its
backward computes meanwhile), before unit k-1 issues its own (one in flight at a time,
torch's default), and the last one is waited before ``backward()`` returns, with every
shard's gradient written. Bit-identity of the trained parameters with the blocking
reduce-scatter is held by the training tests (test_fully_shard.py, test_hsdp.py,
test_fsdp_prefetch.py, test_fsdp_reduce_dtype.py against one process and ml_dtypes).
"""
import numpy as np

from minidist import backend
from tests.distributed import test_fsdp_prefetch as prefetch
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 3])
WIDTHS = [3, 4, 6, 8]


def _logging_reduce_scatter(log, unit_of_bytes):
    """reduce_scatter_tensor that notes ("RS", unit) when issued and ("RS done", unit)
    when its result is waited for (at once for a blocking one)."""
    from minidist.comm.collectives.api import reduce_scatter_tensor

    def wrapped(output, input, *args, **kwargs):
        unit = unit_of_bytes[input.nbytes]
        log.append(("RS", unit))
        work = reduce_scatter_tensor(output, input, *args, **kwargs)
        if work is None:
            log.append(("RS done", unit))
            return None
        wait = work.wait

        def noted_wait(*a, **k):
            done = wait(*a, **k)
            if ("RS done", unit) not in log:
                log.append(("RS done", unit))
            return done
        work.wait = noted_wait
        return work
    return wrapped


def in_flight_case(seed):
    """The backward's log: ('C', i) unit i computes (its recompute), ('RS', i) its
    reduce-scatter issued, ('RS done', i) waited; 'returned' when backward() returns;
    and whether every shard then holds a gradient."""
    import minidist.distributed as dist
    from minidist.autograd.tensor import Tensor
    from minidist.distributed.fsdp import fully_shard
    from minidist.distributed.tensor import _collectives
    n = dist.get_world_size()
    backend.manual_seed(seed)
    model = prefetch._unit_chain(WIDTHS)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    # a unit's reduce-scatter input: its pieces padded to n * ceil(rows / n) rows, float64
    unit_of_bytes = {8 * n * -(-b // n) * (a + 1): i
                     for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:]))}
    x = Tensor(backend.from_host(np.linspace(-1, 1, 2 * 3).reshape(2, 3)))
    plain = _collectives.reduce_scatter_tensor
    _collectives.reduce_scatter_tensor = _logging_reduce_scatter(prefetch.LOG, unit_of_bytes)
    try:
        loss = model(x).sum()
        prefetch.LOG.clear()
        loss.backward()
        prefetch.LOG.append("returned")
    finally:
        _collectives.reduce_scatter_tensor = plain
    log = [("C", e[1]) if e[0] == "compute" else e for e in prefetch.LOG]
    return log, all(p.grad is not None for p in model.parameters())


def test_a_units_reduce_scatter_is_in_flight_while_the_unit_before_computes(world):
    expected = [("C", 2), ("RS", 2),
                ("C", 1), ("RS done", 2), ("RS", 1),     # RS 2 under way while unit 1 computes
                ("C", 0), ("RS done", 1), ("RS", 0),
                ("RS done", 0), "returned"]              # the last one: at backward's end
    for log, every_grad in world.run(in_flight_case, 0):
        assert log == expected
        assert every_grad


def sitting_out_case(strategy):
    """Two Linears, ``b`` left out of the second of three steps (one process on the
    whole batch of 6 rows, each rank its rows; AdamW with weight decay). Returns the
    largest distance from one process's parameters, or the error raised."""
    import minidist.distributed as dist
    from minidist.autograd.tensor import Tensor
    from minidist.nn.layers import Linear
    from minidist.nn.module import Module
    from minidist.optim import AdamW
    n, r = dist.get_world_size(), dist.get_rank()

    class SometimesB(Module):
        def __init__(self):
            super().__init__()
            gen = backend.Generator(0)
            self.a = Linear(4, 4, dtype="float64", generator=gen)
            self.b = Linear(4, 4, dtype="float64", generator=gen)
            self.use_b = True

        def forward(self, x):
            y = self.b(self.a(x)) if self.use_b else self.a(x)
            return (y * y).mean()

    single, model = SometimesB(), SometimesB()
    kwargs = dict(lr=1e-2, weight_decay=0.1)
    if strategy == "zero1":
        from minidist.parallel import Zero1
        wrapper = Zero1(model, AdamW, **kwargs)
        step, zero_grad = wrapper.step, wrapper.zero_grad
    elif strategy.startswith("zero3"):    # "zero3": a unit per Linear; "zero3 root": one
        from minidist.parallel import Zero3
        wrapper = Zero3(model, AdamW, units=[model] if strategy == "zero3 root" else None,
                        **kwargs)
        step, zero_grad = wrapper.step, wrapper.zero_grad
    else:
        from minidist.distributed.fsdp import fully_shard
        if strategy == "units":
            fully_shard(model.a)
            fully_shard(model.b)
        wrapper = fully_shard(model)
        opt = AdamW(model.parameters(), **kwargs)
        step, zero_grad = opt.step, opt.zero_grad
    oracle = AdamW(single.parameters(), **kwargs)
    rng = np.random.default_rng(0)
    per = 6 // n
    try:
        for s in range(3):
            single.use_b = model.use_b = s != 1
            x = rng.standard_normal((6, 4))
            single(Tensor(backend.from_host(x))).backward()
            wrapper(Tensor(backend.from_host(x[r * per:(r + 1) * per]))).backward()
            for update in (oracle.step, oracle.zero_grad, step, zero_grad):
                update()
    except RuntimeError as e:
        return str(e)
    if strategy.startswith("zero3"):
        ours = {k: backend.from_host(v) for k, v in wrapper.full_state_dict().items()}
    elif strategy == "units":
        from minidist.distributed.fsdp import sharded_state_dict
        ours = {k: d.full_tensor().data for k, d in sharded_state_dict(model).items()}
    else:
        ours = {k: p.data for k, p in model.named_parameters()}
    theirs = {k: p.data for k, p in single.named_parameters()}
    return max(float(backend.to_host(abs(ours[k] - theirs[k])).max()) for k in theirs)


def test_a_parameter_its_unit_did_not_use_is_refused(world):
    """A unit that ran without using ``b`` (one unit for the whole model) reduced a zero
    gradient for it, which AdamW stepped (momentum, weight decay): 7e-3 from one
    process, which skips a parameter with no gradient. It is refused, naming the
    parameters; with ``b`` in its own unit, which does not run that step, the model
    trains as one process does."""
    for message in world.run(sitting_out_case, "root"):
        assert isinstance(message, str) and "received no gradient" in message
        assert "own fully_shard unit" in message
    for distance in world.run(sitting_out_case, "units"):
        assert distance <= 1e-12


def nested_sitting_out_case():
    """Two blocks, each its own fully_shard unit inside the root's, block 1's attention
    running without its c_proj: the error fully_shard raises."""
    from minidist.autograd.tensor import Tensor
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn.layers import Linear
    from minidist.nn.module import Module, ModuleList

    class Attention(Module):
        def __init__(self, skip):
            super().__init__()
            self.c_attn, self.c_proj = Linear(4, 4, dtype="float64"), Linear(4, 4, dtype="float64")
            self.skip = skip

        def forward(self, x):
            y = self.c_attn(x)
            return y if self.skip else self.c_proj(y)

    class Block(Module):
        def __init__(self, skip):
            super().__init__()
            self.attn = Attention(skip)

        def forward(self, x):
            return self.attn(x)

    class Model(Module):
        def __init__(self):
            super().__init__()
            self.blocks = ModuleList([Block(False), Block(True)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return (x * x).mean()

    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    try:
        model(Tensor(backend.from_host(np.ones((2, 4))))).backward()
    except RuntimeError as e:
        return str(e)
    return None


def test_the_no_gradient_error_names_parameters_as_the_model_does(world):
    """The refusal named ``Linear.weight`` (the unit's parameters kept no name); each
    unit now keeps its parameters' qualified names from the outermost fully_shard
    (torch's ``_param_fqn``)."""
    for message in world.run(nested_sitting_out_case):
        assert isinstance(message, str), message
        assert "['blocks.1.attn.c_proj.weight', 'blocks.1.attn.c_proj.bias']" in message
