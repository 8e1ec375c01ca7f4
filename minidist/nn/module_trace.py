"""A module's forward and backward as spans of a trace (minidist/trace/), by dotted name.

``Module.__call__`` hands over to ``traced_call`` while a trace is recorded.
The forward is a span around ``forward``. The backward has no call of its own
to wrap (the engine runs the ops' backwards one by one), so identity ops mark
its ends, as torch's full backward hooks do:

    x' = Mark(x)   for each input that wants a gradient: its backward is the *last*
                   thing of the module's backward (dL/dx is complete)
    y' = Mark(y)   for each output that wants a gradient: its backward is the *first*
                   (dL/dy has arrived)

    backward span of the module = [first output mark, last input mark]

A module whose inputs want no gradient (the outermost GPT, a block fed data) has
no input mark; its backward ends when the backwards of the calls inside it have
ended and the gradients of its own parameters (``module._parameters``) are
complete (their post-accumulate hooks):

    backward span = [first output mark, last end of (inner calls' backward spans,
                                                     own parameters' hooks)]

It does not wait for the gradients of inner modules' parameters to land in
``.grad``: under fully_shard they all land after the unit's one reduce-scatter,
and two sibling modules fed token ids would end together, overlapping. (Under a
B/W split those gradients come in a later W pass, among other ops: such a module
then gets no backward span, its work being the pipeline's W span.)

Most calls are of a leaf whose whole backward is one op (Linear, LayerNorm,
Embedding: the op takes the call's inputs and the module's parameters, or what
stands in for them in the call, as fully_shard's gathered parameters, and
nothing else). Its backward span is that op's backward, timed where it runs:
the op's node gets a subclass of its Function whose backward also records
the span (``timed``), and no mark is added. A module's first call is marked,
and shows whether its backward is one op; later calls of such a leaf are timed,
and so is its first call when no input was marked (an embedding): its span is
the op that makes its parameters' gradients, not the wait until they land in
``.grad``, which under fully_shard comes after the unit's shared reduce-scatter
and would make the spans of sibling embeddings overlap.
A leaf without parameters (Dropout, GELU) gets neither: its backward is one op
of the module around it. Nothing here runs unless a trace is being recorded.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist.autograd import grad_mode, weight_grad
from minidist.autograd.function import Context, Function
from minidist.autograd.tensor import Tensor
from minidist.trace import recorder as trace


class Mark(Function):
    """y = x; its backward calls ``note()`` and passes dL/dy on unchanged."""

    @staticmethod
    def forward(ctx, x, note: Callable[[], None] = None):
        ctx.note = note
        return x                                     # the same array: nothing is copied

    @staticmethod
    def backward(ctx, grad):
        ctx.note()
        return grad


def mark(x: Tensor, note: Callable[[], None]) -> Tensor:
    """``Mark.apply(x, note=note)`` for a tensor ``x`` that wants a gradient: the
    same graph node, built without ``apply``'s checks of every argument (a trace
    makes four marks per module call, so this is on tracing's hot path)."""
    ctx = Context()
    ctx.fn, ctx.note, ctx.n_outputs = Mark, note, 1
    ctx.needs_input_grad, ctx.inputs = (True,), (x,)
    return Tensor._from_op(x.data, ctx, 0)


class _Backward:
    """The two ends of one call's backward: its start noted by the first output
    mark; its end when ``parts`` things are done (input marks, or parameters and
    the backwards of the calls inside it); then it tells ``parent``, the call
    around it that waits for it, if any."""

    __slots__ = ("name", "parts", "start", "params", "parent")   # no __dict__: less for the GC

    def __init__(self, name: str, parts: int):
        self.name, self.parts, self.start, self.params = name, parts, None, False
        self.parent = None

    def output_grad(self) -> None:
        if self.start is None and trace.active is not None:
            if self.params and weight_grad.splitting:
                self.parts = -1          # its parameters' gradients come in a W pass
            self.start = trace.active.now()

    def part_done(self) -> None:
        self.parts -= 1
        if self.parts == 0:
            if self.start is not None and trace.active is not None:
                trace.active.span(f"{self.name} backward", "module", self.start,
                                  trace.active.now())
            if self.parent is not None:
                self.parent.part_done()


# The backward ends that wait for parameters' gradients: id(parameter) -> the
# ends waiting; the hooks that serve them stay on the parameters while recording.
_waiting: dict[int, list[_Backward]] = {}
_hooked: dict[int, tuple] = {}           # id(parameter) -> (parameter, its hook's handle)
# (keyed by the module itself, not its id: no module is freed and its id reused
# while recording)
_params: dict[Any, list] = {}            # module -> its parameters that want gradients
_one_op: dict[Any, bool] = {}            # leaf module -> its last backward was one op
_timed_ops: dict[type, type] = {}        # Function -> its subclass that records a span
_open: list = []                         # the calls whose forward is running, innermost last


def timed(fn: type) -> type:
    """The subclass of the op ``fn`` whose backward is also the span
    ``ctx.span_name`` (once per node: a B/W split calls backward twice, and its
    first call, the input gradient, is what a marked module's span covers)."""
    cls = _timed_ops.get(fn)
    if cls is None:
        def backward(ctx: Any, *grads: Any) -> Any:
            start = trace.active.now() if trace.active is not None else None
            grads_in = fn.backward(ctx, *grads)
            if start is not None and ctx.span_name is not None and trace.active is not None:
                trace.active.span(ctx.span_name, "module", start, trace.active.now())
                ctx.span_name = None
                if ctx.span_parent is not None:
                    ctx.span_parent.part_done()
            return grads_in
        cls = _timed_ops[fn] = type(fn.__name__, (fn,), {"backward": staticmethod(backward)})
    return cls


def _is_one_op(node: Any, args: tuple, module: Any) -> bool:
    """Is the call's whole backward the backward of ``node``: every input of the op an
    argument of the call or a parameter of the module, and every argument that wants
    a gradient an input of the op?"""
    if node is None or node.fn is Mark:
        return False
    used = {id(t) for t in node.inputs if t is not None}
    wanted = {id(a) for a in args if isinstance(a, Tensor) and a.requires_grad}
    if not wanted <= used:
        return False
    own = {id(a) for a in args if isinstance(a, Tensor)}
    own.update(id(p) for p in module._parameters.values() if p is not None)
    # the values the module computes with: its parameters, or what stands in for them
    # in the call (fully_shard's gathered parameters, put on the module as attributes)
    own.update(id(getattr(module, n, None)) for n in module._parameters)
    return used <= own


def _gradient_done(p: Tensor) -> None:
    """A parameter's gradient is complete (its post-accumulate hook): for the calls
    whose backward has started (a pipeline has several in flight)."""
    waiting = _waiting.pop(id(p), ())
    later = [back for back in waiting if back.start is None]
    if later:
        _waiting[id(p)] = later
    for back in waiting:
        if back.start is not None:
            back.part_done()


def _wait_for_parameters(rec: Any, module: Any, back: _Backward) -> None:
    """End ``back`` when the gradients of ``module``'s own parameters are complete
    (and the backwards of the calls inside it, counted in ``back.parts`` already)."""
    params = _params.get(module)
    if params is None:
        params = _params[module] = [p for p in module._parameters.values()
                                    if p is not None and p.requires_grad]
    back.parts, back.params = back.parts + len(params), True
    if not _hooked:
        rec.on_close.append(_unhook)     # nothing is left on the parameters after
    for p in params:
        if id(p) not in _hooked:
            _hooked[id(p)] = (p, p.register_post_accumulate_grad_hook(_gradient_done))
        _waiting.setdefault(id(p), []).append(back)


def _unhook() -> None:
    for _, handle in _hooked.values():
        handle.remove()
    _hooked.clear()
    _waiting.clear()
    _params.clear()
    _one_op.clear()


def traced_call(module: Any, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` with its forward span and backward marks."""
    rec = trace.active
    name, span_args = rec.enter_module(module)
    # (a leaf without parameters, Dropout or GELU, gets its forward span only: its
    # backward is one op, and marks cost two autograd nodes per call)
    back, inputs, one_op = None, 0, False
    if grad_mode.is_grad_enabled() and (module._parameters or module._modules):
        one_op = _one_op.get(module, False)   # then no marks: its op is timed
        back, marked = _Backward(name, 0), []
        for a in args:   # (a loop, not generators: this runs at every module call)
            if isinstance(a, Tensor) and a.requires_grad and not one_op:
                inputs += 1
                a = mark(a, back.part_done)
            marked.append(a)
        args, back.parts = tuple(marked), inputs
    # the call that waits for this one's backward: the call around it, if that has no
    # input to mark (its end is then the end of the backwards inside it)
    parent = _open[-1] if _open else None
    parent = parent if parent is not None and parent.params else None
    if back is not None:
        back.params = not inputs and bool(module._modules)   # (it waits for what is inside)
        _open.append(back)
    start = rec.now()
    try:
        out = module.forward(*args, **kwargs)
    finally:
        if back is not None:
            _open.pop()
        rec.exit_module()
        rec.span(name, "module", start, rec.now(), span_args)
    if back is None:
        return out
    outs = out if isinstance(out, tuple) else (out,)
    wanted = [isinstance(o, Tensor) and o.requires_grad for o in outs]
    if not any(wanted):
        return out                       # no backward goes through this call
    if not module._modules and isinstance(out, Tensor):   # a leaf: is its backward one op?
        _one_op[module] = _is_one_op(out._ctx, args, module)
        if not inputs and _one_op[module]:   # (no input marks in the op's way)
            out._ctx.fn, out._ctx.span_name = timed(out._ctx.fn), f"{name} backward"
            out._ctx.span_parent = parent
            if parent is not None:
                parent.parts += 1
            return out
    if not inputs:   # after the forward: an inner module's span ends first, as it nests
        _wait_for_parameters(rec, module, back)
        if not back.parts:
            return out                   # nothing of its own gets a gradient
    if parent is not None:
        back.parent = parent
        parent.parts += 1
    if isinstance(out, tuple):
        return tuple(mark(o, back.output_grad) if w else o for o, w in zip(out, wanted))
    return mark(out, back.output_grad)
