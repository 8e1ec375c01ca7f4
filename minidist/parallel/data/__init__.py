"""Data parallelism: every rank holds the whole model and reads its own slice of the batch.

After backward each gradient is averaged over the N ranks, so every replica takes the
same step as one process would on the whole batch:

    g = (1/N) * sum_r g_r          ring all-reduce: T = 2(N-1)/N * M/B + 2(N-1) * alpha

Files, in reading order:

- naive.py       ``DataParallelNaive``: one all-reduce per parameter after backward (the oracle)
- buckets.py     gradients packed into flat buckets of ~25 MB, filled in reverse order
- ddp.py         ``DistributedDataParallel``: bucketed all-reduce overlapped with backward, no_sync
- hooks.py       communication hooks: ``GradBucket``, ``Future``, fp16 / bf16 compression
- powersgd.py    ``PowerSGDState``, ``powerSGD_hook``: rank-r approximation, error feedback
- topk.py        ``TopKState``, ``topk_hook``: the k largest entries as (index, value), error feedback
- hook_state.py  a hook's memory (residuals, PowerSGD's Q's and step) in state_dict / pickle
- onebit.py      the 1-bit compressed all-reduce: signs + one scale, worker and server errors
- onebit_adam.py ``OnebitAdam``: Adam for a warm-up, then frozen variance and 1-bit momentum
- onebit_layout.py which parameters 1-bit Adam's flat vectors hold; how every rank agrees on it
- timeline.py    when each bucket communicated relative to backward; the hidden fraction
- sync_check.py  ``verify_parameter_sync``: are the replicas still bitwise equal?
- sampler.py     ``DistributedSampler``: which samples each rank reads, ``set_epoch``

Docs: docs/ddp.md, docs/compression.md. Demos: demos/04_ddp.py, demos/18_compression.py. Tests: tests/parallel/data/. Bench: bench/bench_ddp.py.
"""
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.naive import DataParallelNaive, amax_reduce, found_inf_reduce
from minidist.parallel.data.sampler import DistributedSampler
from minidist.parallel.data.sync_check import verify_parameter_sync

__all__ = ["DataParallelNaive", "DistributedDataParallel", "DistributedSampler",
           "found_inf_reduce", "amax_reduce", "verify_parameter_sync"]
