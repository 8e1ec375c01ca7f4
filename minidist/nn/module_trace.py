"""A module's forward and backward as spans of a trace (minidist/trace/), by dotted name.

``Module.__call__`` hands over to ``traced_call`` while a trace is recorded.
The forward is a span around ``forward``. The backward has no call of its own
to wrap (the engine runs the ops' backwards one by one), so identity ops mark
its ends, as torch's full backward hooks do (autograd/hooks.py, ``on_gradient``):

    x' = on_gradient(x, hook)   for each input that wants a gradient: its backward is
                                the *last* thing of the module's backward (dL/dx is complete)
    y' = on_gradient(y, hook)   for each output that wants a gradient: its backward is
                                the *first* (dL/dy has arrived)

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
B/W split, ``weight_grad.in_b_pass()``, those gradients come in a later W pass,
among other ops: such a module then gets no backward span, its work being the
pipeline's W span.)

Most calls are of a leaf whose whole backward is one op (Linear, LayerNorm,
Embedding: the op takes the call's inputs and the module's parameters, or the
values put in their place for the call, ``Module.values_in_use``, and nothing
else). Its backward span is that op's backward, timed where it runs by the
node's hooks (``Context.register_prehook`` / ``register_hook``: ``time_op``),
and no mark is added. A module's first call is marked,
and shows whether its backward is one op; later calls of such a leaf are timed,
and so is its first call when no input was marked (an embedding): its span is
the op that makes its parameters' gradients, not the wait until they land in
``.grad``, which under fully_shard comes after the unit's shared reduce-scatter
and would make the spans of sibling embeddings overlap.
A leaf without parameters (Dropout, GELU) gets neither: its backward is one op
of the module around it. Nothing here runs unless a trace is being recorded.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd import grad_mode, weight_grad
from minidist.autograd.function import Context
from minidist.autograd.hooks import BackwardHook, on_gradient
from minidist.autograd.tensor import Tensor
from minidist.trace import recorder as trace


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
            if self.params and weight_grad.in_b_pass():
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


class ModuleTrace:
    """What tracing modules keeps while one recording lasts, owned by the recorder
    (``trace.active.modules``, made at the first traced call; dropped with it):
    the dotted names of the calls, the calls in progress, and the backward ends
    that wait for parameters' gradients, with the hooks that serve them (removed
    when recording ends). Keyed by the module itself, not its id: no module is freed
    and its id reused while recording."""

    def __init__(self) -> None:
        self.names: dict[tuple, tuple] = {}    # (id(parent), id(child)) -> (name, span args)
        self.paths: dict[int, str] = {}        # id(module) -> its path when last named in a parent
        self.calls: list[tuple] = []           # (dotted path, module) of the calls in progress
        self.open: list = []                   # their _Backward ends (or None), innermost last
        self.waiting: dict[int, list[_Backward]] = {}   # id(parameter) -> ends waiting for it
        self.hooked: dict[int, tuple] = {}     # id(parameter) -> (parameter, its hook's handle)
        self.params: dict[Any, list] = {}      # module -> its parameters that want gradients
        self.one_op: dict[Any, bool] = {}      # leaf module -> its last backward was one op

    def module_name(self, module: Any) -> tuple[str, dict]:
        """The dotted path of ``module`` inside the outermost module being called
        (``h.3.attn``, as in ``named_modules``; "" for the outermost itself), and
        the args of its spans, ``{"module": class name}``."""
        parent_path, parent = self.calls[-1] if self.calls else ("", None)
        key = (id(parent), id(module))
        found = self.names.get(key)
        if found is None and parent is None and id(module) in self.paths:
            # called on its own after being called inside the model (fully_shard's
            # recompute in backward runs a unit's forward directly): its path there
            return self.paths[id(module)], {"module": type(module).__name__}
        if found is None:
            path = type(module).__name__ if parent is not None else ""
            for name, inner in parent.named_modules() if parent is not None else ():
                if inner is module and name:   # a child, or inside a ModuleList
                    path = f"{parent_path}.{name}" if parent_path else name
                    break                      # (else: called from a module it is not in)
            found = self.names[key] = (path, {"module": type(module).__name__})
            if parent is not None:
                self.paths[id(module)] = path
        return found

    def enter(self, module: Any) -> tuple[str, dict]:
        """A module's forward starts: returns the span's name (its dotted path; the
        class name for the outermost module) and args. ``exit`` when it returns."""
        parent = self.calls[-1][1] if self.calls else None
        found = self.names.get((id(parent), id(module)))   # (module_name, once per call site)
        path, args = found if found is not None else self.module_name(module)
        self.calls.append((path, module))
        return path or type(module).__name__, args

    def exit(self) -> None:
        self.calls.pop()

    def gradient_done(self, p: Tensor) -> None:
        """A parameter's gradient is complete (its post-accumulate hook): for the calls
        whose backward has started (a pipeline has several in flight)."""
        waiting = self.waiting.pop(id(p), ())
        later = [back for back in waiting if back.start is None]
        if later:
            self.waiting[id(p)] = later
        for back in waiting:
            if back.start is not None:
                back.part_done()

    def wait_for_parameters(self, module: Any, back: _Backward) -> None:
        """End ``back`` when the gradients of ``module``'s own parameters are complete
        (and the backwards of the calls inside it, counted in ``back.parts`` already)."""
        params = self.params.get(module)
        if params is None:
            params = self.params[module] = [p for p in module._parameters.values()
                                            if p is not None and p.requires_grad]
        back.parts, back.params = back.parts + len(params), True
        for p in params:
            if id(p) not in self.hooked:
                handle = p.register_post_accumulate_grad_hook(self.gradient_done)
                self.hooked[id(p)] = (p, handle)
            self.waiting.setdefault(id(p), []).append(back)

    def unhook(self) -> None:
        """Recording ends: nothing is left on the parameters."""
        for _, handle in self.hooked.values():
            handle.remove()
        self.hooked.clear()
        self.waiting.clear()


def module_trace(rec: Any) -> ModuleTrace:
    """The recorder's ModuleTrace, made at its first traced call."""
    state = rec.modules
    if state is None:
        state = rec.modules = ModuleTrace()
        rec.on_close.append(state.unhook)
    return state


def time_op(node: Context, name: str, parent: _Backward | None) -> None:
    """Make the backward of the op ``node`` the span ``name``, then tell ``parent`` (once
    per node: a B/W split calls backward twice, and its first call, the input
    gradient, is what a marked module's span covers). A node met again (a selective
    checkpoint's recompute hands back the forward's) gets the new name, not two spans."""
    if _op_started not in node.pre_hooks:
        node.register_prehook(_op_started)
        node.register_hook(_op_ended)
    node.span_name, node.span_parent = name, parent


def _op_started(node: Context) -> None:
    node.span_start = trace.active.now() if trace.active is not None else None


def _op_ended(node: Context) -> None:
    if node.span_start is not None and node.span_name is not None and trace.active is not None:
        trace.active.span(node.span_name, "module", node.span_start, trace.active.now())
        node.span_name = None
        if node.span_parent is not None:
            node.span_parent.part_done()


def _is_one_op(node: Any, args: tuple, module: Any) -> bool:
    """Is the call's whole backward the backward of ``node``: every input of the op an
    argument of the call or a parameter of the module, and every argument that wants
    a gradient an input of the op?"""
    if node is None or node.fn is BackwardHook:
        return False
    used = {id(t) for t in node.inputs if t is not None}
    wanted = {id(a) for a in args if isinstance(a, Tensor) and a.requires_grad}
    if not wanted <= used:
        return False
    own = {id(a) for a in args if isinstance(a, Tensor)}
    own.update(id(p) for p in module._parameters.values() if p is not None)
    own.update(id(v) for v in module.values_in_use())   # (a gathered weight put in place)
    return used <= own


def _mark_inputs(state: ModuleTrace, module: Any, name: str,
                 args: tuple) -> tuple[_Backward | None, tuple, int]:
    """(the call's backward ends, its arguments with those that want a gradient marked,
    how many were). A leaf without parameters (Dropout, GELU) gets no backward ends (its
    forward span only: its backward is one op, and marks cost two autograd nodes per
    call); a leaf whose backward was one op gets no marks (its op is timed)."""
    if not (grad_mode.is_grad_enabled() and (module._parameters or module._modules)):
        return None, args, 0
    one_op = state.one_op.get(module, False)
    back, marked, inputs = _Backward(name, 0), [], 0
    for a in args:   # (a loop, not generators: this runs at every module call)
        if isinstance(a, Tensor) and a.requires_grad and not one_op:
            inputs += 1
            a = on_gradient(a, back.part_done)
        marked.append(a)
    back.parts = inputs
    return back, tuple(marked), inputs


def traced_call(module: Any, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` with its forward span and backward marks."""
    rec = trace.active
    state = module_trace(rec)
    name, span_args = state.enter(module)
    back, args, inputs = _mark_inputs(state, module, name, args)
    # the call that waits for this one's backward: the call around it, if that has no
    # input to mark (its end is then the end of the backwards inside it)
    parent = state.open[-1] if state.open else None
    parent = parent if parent is not None and parent.params else None
    if back is not None:
        back.params = not inputs and bool(module._modules)   # (it waits for what is inside)
        state.open.append(back)
    start = rec.now()
    try:
        out = module.forward(*args, **kwargs)
    finally:
        if back is not None:
            state.open.pop()
        state.exit()
        rec.span(name, "module", start, rec.now(), span_args)
    if back is None:
        return out
    outs = out if isinstance(out, tuple) else (out,)
    wanted = [isinstance(o, Tensor) and o.requires_grad for o in outs]
    if not any(wanted):
        return out                       # no backward goes through this call
    if not module._modules and isinstance(out, Tensor):   # a leaf: is its backward one op?
        state.one_op[module] = _is_one_op(out._ctx, args, module)
        if not inputs and state.one_op[module]:   # (no input marks in the op's way)
            time_op(out._ctx, f"{name} backward", parent)
            if parent is not None:
                parent.parts += 1
            return out
    if not inputs:   # after the forward: an inner module's span ends first, as it nests
        state.wait_for_parameters(module, back)
        if not back.parts:
            return out                   # nothing of its own gets a gradient
    if parent is not None:
        back.parent = parent
        parent.parts += 1
    if isinstance(out, tuple):
        return tuple(on_gradient(o, back.output_grad) if w else o for o, w in zip(out, wanted))
    return on_gradient(out, back.output_grad)
