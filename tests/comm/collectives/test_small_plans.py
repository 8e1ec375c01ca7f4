"""The small all-reduce (small.py) keeps its plan, table included, for every array
that ``auto`` sends through it, so a training loop pays for making and zeroing
the table once, not per call."""


def _plan_kept_after_two_calls(count):
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.group import resolve
    x = xp.ones(count, dtype="float32")
    key = (x.shape, x.dtype, dist.ReduceOp.SUM)
    dist.all_reduce(x)
    first = resolve(None).small_plans.get(key)
    dist.all_reduce(x)
    kept = first is not None and resolve(None).small_plans.get(key) is first
    return kept, dist.get_stats().last["algorithm"], float(x[0])


def test_auto_keeps_the_plan_of_the_largest_array_it_gathers(worlds):
    from minidist.comm.collectives.all_reduce import thresholds
    for n in (2, 4):
        gather = thresholds(n).gather_bytes
        if gather < 4 * (n - 1):
            continue                                            # auto never gathers at n
        count = gather // (n - 1) // 4                          # (N-1) * M = gather_bytes
        for rank, (kept, algorithm, value) in enumerate(worlds.get(n).run(
                _plan_kept_after_two_calls, count)):
            assert algorithm == "allgather", f"world {n}, rank {rank}: {algorithm}"
            assert kept, f"world {n}, rank {rank}: the plan was made again"
            assert value == n * n                               # ones, summed twice
