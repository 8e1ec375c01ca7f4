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
