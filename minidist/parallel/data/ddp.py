"""DistributedDataParallel: bucketed gradient all-reduce that overlaps backward.

The same math as ``DataParallelNaive`` (naive.py), g = (1/N) sum_r g_r, with
the two things that make it fast:

1. **Buckets** (buckets.py): gradients are copied into a few flat buffers of
   about ``bucket_cap_mb`` each, and one all-reduce moves a whole bucket, so the
   per-message latency alpha is paid once per bucket, not once per parameter.
2. **Overlap**: each parameter's post-accumulate-grad hook fires as soon as
   backward has finished its gradient. When the last gradient of a bucket
   arrives, the bucket's all-reduce starts asynchronously (``async_op=True``, a
   background thread moves it) while backward goes on computing the earlier
   layers. When the last bucket has started, the hook waits for all of them and
   points each ``p.grad`` at its averaged slice of the bucket.

    step time ~ compute + max(0, comm - overlappable compute)  (overlap=True)
    step time ~ compute + comm                                 (overlap=False)

``no_sync()`` skips the communication: gradients accumulate locally in
``p.grad`` over several micro-batches, and the first backward outside the
context all-reduces the accumulated sum once (one all-reduce per bucket per
accumulation cycle).

Every parameter must receive a gradient in every synchronised backward (as
torch's default ``find_unused_parameters=False``); otherwise its bucket never
fills, and the next forward raises naming the parameters that got none.
Parameters are broadcast from rank 0 at construction. ``check_parameters_in_sync``
verifies, sending O(1) numbers per parameter, that all ranks hold the same bits
(sync_check.py). The demo is demos/04_ddp.py; bench/bench_ddp.py measures the
overlap.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import minidist.distributed as dist
from minidist.autograd.engine import set_empty_grad
from minidist.distributed._shared_tokens import share_tokens
from minidist.distributed.tensor._piece_norm import refuse_pieces_as_replicas
from minidist.nn.module import Module
from minidist.optim.optimizer import optimizer_bytes
from minidist.parallel.data.buckets import DEFAULT_BUCKET_CAP_MB, Bucket, assign_buckets
from minidist.parallel.data.hooks import Future, GradBucket, allreduce_hook
from minidist.parallel.data.timeline import bucket_event, hidden_fraction, trace_buckets
from minidist.parallel.data.sync_check import verify_parameter_sync
from minidist.parallel.data.naive import broadcast_parameters
from minidist.trace import recorder as trace


class DistributedDataParallel(Module):
    """Wrap ``module`` for data-parallel training (see the module docstring).

    ``bucket_cap_mb``: bucket size in MB (1e6 bytes, as torch); ``overlap``: start
    each bucket's all-reduce during backward (True) or all of them after it (False,
    for comparison); ``gradient_as_bucket_view``: each ``p.grad`` is a view of its
    bucket (as torch's option of that name): forward gives a parameter without
    a gradient its view as an empty ``.grad`` (``set_empty_grad``: values not
    written yet), and backward copies the gradient straight into it (later
    micro-batches of ``no_sync`` add into it in place), instead of into a new
    array that DDP then copies into the bucket; ``broadcast_buffers`` is not
    needed (minidist modules hold parameters only).
    """

    def __init__(self, module: Module, group: Any = None,
                 bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB, overlap: bool = True,
                 gradient_as_bucket_view: bool = True):
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.overlap = overlap
        self.require_sync = True
        # every rank's copy must be one tensor: not an expert rank's own experts
        refuse_pieces_as_replicas(list(module.named_parameters()), group, "DDP")
        broadcast_parameters(module, group)
        share_tokens(module, group, "batch")    # the routers' counts: every replica's batch
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets: list[Bucket] = assign_buckets(params, bucket_cap_mb * 1e6)
        self._slot: dict[int, tuple[Bucket, int]] = {}
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self._slot[id(p)] = (b, i)
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self._names = {id(p): n for n, p in module.named_parameters()}
        self._launched: list[Bucket] = []
        self._t0 = time.perf_counter()
        self.timeline: list[dict] = []   # per bucket of the last synchronised backward
        self._hook, self._hook_state, self._hook_registered = allreduce_hook, group, False

    # -- forward ----------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._check_no_pending_reduction()
        if self.gradient_as_bucket_view:
            self._grads_as_bucket_views()
        out = self.module(*args, **kwargs)
        self._t0 = time.perf_counter()   # the timeline counts from the end of forward
        return out

    def _grads_as_bucket_views(self) -> None:
        """A parameter without a gradient (the first step, or after
        ``zero_grad()``) gets its bucket view as an empty ``.grad``: backward
        copies its first gradient there (autograd/engine.py), the bits of
        filling the view with -0.0 (x + -0.0 is x) without a pass over the
        bucket. Until backward writes it, the view still holds the last step's
        gradient."""
        for b in self.buckets:
            for p, view in zip(b.params, b.views):
                if p.grad is None:
                    set_empty_grad(p, view)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next backward outside syncs them all."""
        previous = self.require_sync
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = previous

    # -- backward: the hooks --------------------------------------------------
    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Replace the bucket all-reduce by ``hook(state, bucket) -> Future`` (hooks.py,
        powersgd.py), as torch's DDP does. Once, before the first backward."""
        if self._hook_registered:
            raise RuntimeError("register_comm_hook: a communication hook is already "
                               "registered; it can be registered only once")
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be callable, got {hook!r}")
        self._hook, self._hook_state, self._hook_registered = hook, state, True

    def _communicate(self, bucket: Bucket, is_last: bool) -> Future:
        return self._hook(self._hook_state, GradBucket(bucket, is_last))

    # -- backward: the hooks --------------------------------------------------
    def _grad_ready(self, p: Any) -> None:
        """Runs inside backward, once ``p.grad`` is final for this backward."""
        if not self.require_sync:
            return
        bucket, position = self._slot[id(p)]
        bucket.add(position, p.grad)
        if not bucket.is_full():
            return
        is_last = len(self._launched) + 1 == len(self.buckets)
        bucket.launched_at = time.perf_counter()            # ready: the hook may start
        if self.overlap:
            bucket.work = self._communicate(bucket, is_last)
        self._launched.append(bucket)
        if is_last:
            self._finish()

    def _finish(self) -> None:
        """After the last bucket started: wait, and hand out p.grad views of the buckets."""
        backward_end = time.perf_counter()
        self.timeline = []
        for k, b in enumerate(self._launched):
            future = b.work
            if future is None:                               # overlap=False: now, in order
                future = b.work = self._communicate(b, k == len(self._launched) - 1)
            averaged = future.wait()
            if averaged is not b.flat:
                b.flat[...] = averaged                       # the hook's result, (numel,)
            for p, view in zip(b.params, b.views):
                p.grad = view                                # the bucket is the gradient
            self.timeline.append(bucket_event(b, future, self._t0, backward_end))
        self.timeline.append(dict(backward_end_ms=1e3 * (backward_end - self._t0),
                                  hidden_fraction=hidden_fraction(self.timeline)))
        if trace.active is not None:   # the timeline's buckets, on the thread that ran them
            trace_buckets(trace.active, self._launched, backward_end)
        for b in self.buckets:
            b.reset()
        self._launched = []

    def _check_no_pending_reduction(self) -> None:
        pending = [b for b in self.buckets if b.ready]
        if not pending:
            return
        missing = [self._names.get(id(p), "?") for b in self.buckets for p in b.params
                   if id(p) not in b.ready]
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()             # do not leave a collective half-way
            b.reset()
        self._launched = []
        raise RuntimeError("DistributedDataParallel: the previous backward did not finish "
                           "reducing gradients, because these parameters received no "
                           f"gradient: {missing}. Every parameter must take part in the "
                           "loss on every rank (unused parameters are not supported).")

    # -- checks and accounting ---------------------------------------------------
    def check_parameters_in_sync(self) -> None:
        """Raise ``RuntimeError`` naming every parameter whose bits differ across ranks."""
        named = list(self.module.named_parameters())
        diverged = verify_parameter_sync(named, self.group)
        if diverged:
            raise RuntimeError(f"parameters differ across ranks: {diverged}")

    def memory_report(self, optimizer: Any = None, weight_bytes: float | None = None) -> dict:
        """Bytes this rank holds for parameters, gradients (the buckets) and the optimizer.

        ``weight_bytes``: bytes per element to count weights and gradients at (2 for an
        emulated fp16/bf16 model whose values sit in float32 arrays); default their
        itemsize. Optimizer bytes are its state arrays plus any parameter arrays it
        owns that are not the model's (a float32 master copy). DDP keeps everything on
        every rank: 16 bytes per parameter for Adam in either precision.
        """
        params = list(self.module.parameters())
        width = (lambda a: weight_bytes) if weight_bytes else (lambda a: a.itemsize)
        report = dict(params=sum(p.data.size * width(p.data) for p in params),
                      grads=sum(b.flat.size * width(b.flat) for b in self.buckets),
                      optimizer=optimizer_bytes(optimizer, params) if optimizer else 0)
        report["total"] = report["params"] + report["grads"] + report["optimizer"]
        return report
