"""``Module`` and ``Parameter``: the containers a model is built from.

A ``Module`` finds its parameters by looking at its own attributes: assigning
a ``Parameter`` or another ``Module`` to ``self.something`` registers it, as in
``torch.nn.Module``. Names are dotted paths (``blocks.0.attn.c_attn.weight``),
so ``state_dict()`` of a PyTorch model with the same structure lines up key
for key.

A buffer is state that is not a parameter (no gradient, no optimizer) but belongs
to the model: ``register_buffer(name, array, persistent=True)``, as in torch (the
MoE router's selection bias ``expert_bias``). Assigning a new array to its name
replaces it. A persistent buffer is in ``state_dict()`` (each module's parameters,
then its buffers, then its children's: torch's order) and ``load_state_dict()``
copies it back; ``persistent=False`` keeps it out of both.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator

from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.trace import recorder as trace
from minidist.nn.module_trace import traced_call


class Parameter(Tensor):
    """A leaf tensor that a ``Module`` registers and an optimizer updates."""

    __slots__ = ()

    def __init__(self, data: Any, requires_grad: bool = True):
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, dtype={self.dtype})"


class Module:
    """Base class of every layer and model: override ``forward``."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ "
                               "before assigning attributes")
        buffers = self.__dict__.get("_buffers", {})
        if name in buffers and not isinstance(value, (Parameter, Module)):
            if value is not None and not backend.is_array(value):
                raise TypeError(f"cannot assign {type(value).__name__} to the buffer {name!r} "
                                f"of {type(self).__name__}: an array (or None) is expected")
            buffers[name] = value            # the buffer, replaced (torch's semantics)
            object.__setattr__(self, name, value)
            return
        buffers.pop(name, None)
        self.__dict__.get("_non_persistent_buffers", set()).discard(name)
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if trace.active is not None:   # spans named by the dotted path (module_trace.py)
            return traced_call(self, args, kwargs)
        return self.forward(*args, **kwargs)

    # -- traversal ----------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator["Module"]:
        yield from self._modules.values()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Each parameter once (a tied parameter under its first name)."""
        yield from self._named_once("_parameters", prefix)

    def _named_once(self, table: str, prefix: str) -> Iterator[tuple[str, Any]]:
        """The entries of every module's ``table`` (``_parameters``, ``_buffers``), each
        object once under its first dotted name, None left out."""
        seen: set[int] = set()
        for mod_name, mod in self.named_modules(prefix):
            for name, v in getattr(mod, table).items():
                if v is None or id(v) in seen:
                    continue
                seen.add(id(v))
                yield (f"{mod_name}.{name}" if mod_name else name), v

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def register_buffer(self, name: str, array: Any, persistent: bool = True) -> None:
        """Register ``array`` (or None) as the buffer ``name``, read as ``self.<name>``:
        state that is not a parameter. ``persistent``: whether ``state_dict()`` holds it
        (torch's semantics; a non-persistent buffer is rebuilt by ``__init__``)."""
        if "_buffers" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ "
                               "before registering buffers")
        if not name or "." in name:
            raise KeyError(f"a buffer's name is a non-empty attribute name without '.', "
                           f"got {name!r}")
        if name in self._parameters or name in self._modules or (
                hasattr(self, name) and name not in self._buffers):
            raise KeyError(f"{type(self).__name__} already has an attribute {name!r}")
        if array is not None and not backend.is_array(array):
            raise TypeError(f"buffer {name!r}: an array of the active backend (or None) is "
                            f"expected, got {type(array).__name__}")
        self._buffers[name] = array
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)
        object.__setattr__(self, name, array)

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Each buffer once (one shared by two modules under its first name), None left
        out, as torch's ``named_buffers``."""
        yield from self._named_once("_buffers", prefix)

    def buffers(self) -> Iterator[Any]:
        for _, b in self.named_buffers():
            yield b

    def _persistent_state(self) -> Iterator[tuple[str, Any, bool]]:
        """(name, parameter or array, is_buffer) of what ``state_dict`` holds, in torch's
        order: each module's parameters, then its persistent buffers, then its children."""
        seen: set[int] = set()
        for mod_name, mod in self.named_modules():
            dot = f"{mod_name}." if mod_name else ""
            for name, p in mod._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield dot + name, p, False
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent_buffers and \
                        id(b) not in seen:
                    seen.add(id(b))
                    yield dot + name, b, True

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- a value in place of a parameter, for one call ------------------------
    def put_in_place(self, name: str, value: Any) -> None:
        """Make ``forward`` compute with ``value`` where it reads the parameter ``name``
        (``self.<name>``); the parameter stays registered (``parameters()``, the optimizer).
        fully_shard puts a unit's gathered weights for its call and the pieces back after
        (torch's FSDP2 swaps the same way); sequence parallelism, its replicated weights."""
        object.__setattr__(self, name, value)

    def values_in_use(self) -> list:
        """What ``forward`` computes with for each of this module's own parameters: the
        parameter, or the value ``put_in_place`` put there (a trace of modules asks)."""
        return [self.__dict__.get(name, p) for name, p in self._parameters.items()]

    # -- modes and gradients ------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # -- state --------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, Any]":
        """Parameter and persistent buffer name -> array (the live arrays, not copies, as
        in PyTorch; torch's order, ``_persistent_state``); a module with a state-dict post
        hook then replaces its entries (tensor parallelism: its parameters by DTensors,
        each holding this rank's piece; a buffer stays the array every rank holds)."""
        out = OrderedDict((name, v if buffer else v.data)
                          for name, v, buffer in self._persistent_state())
        for name, module in self.named_modules():
            for hook in module.__dict__.get("_state_dict_post_hooks", ()):
                hook(module, out, f"{name}." if name else "")
        return out

    def register_state_dict_post_hook(self, hook: Any) -> None:
        """``hook(module, state_dict, prefix)`` runs after ``state_dict()`` has filled the
        entries of this module (named ``prefix + name``) and may replace them. torch's
        name; its hook also takes ``local_metadata``."""
        self.__dict__.setdefault("_state_dict_post_hooks", []).append(hook)

    def register_load_state_dict_pre_hook(self, hook: Any) -> None:
        """``hook(module, state_dict, prefix)`` runs before ``load_state_dict`` copies, on a
        copy of the given dict, and may replace this module's entries by what its
        parameters hold (tensor parallelism: this rank's piece of a DTensor or of a whole
        array). torch's name; its hook takes more arguments."""
        self.__dict__.setdefault("_load_state_dict_pre_hooks", []).append(hook)

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy arrays into the parameters and persistent buffers (in place); names (with
        ``strict``) and shapes must match."""
        state = dict(state)                   # the pre hooks replace entries of a copy
        for name, module in self.named_modules():
            for hook in module.__dict__.get("_load_state_dict_pre_hooks", ()):
                hook(module, state, f"{name}." if name else "")
        own = {name: v for name, v, _ in self._persistent_state()}
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"state_dict mismatch: missing {missing}, unexpected {unexpected}")
        for name, value in state.items():
            if name not in own:
                continue
            target = own[name]
            target = target.data if isinstance(target, Parameter) else target
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"{name}: shape {tuple(value.shape)} in the state_dict, "
                                 f"{tuple(target.shape)} in the model")
            if not backend.is_array(value):
                value = backend.from_host(value)
            target[...] = value.astype(target.dtype, copy=False)   # the assignment copies

    def to_dtype(self, dtype: Any) -> "Module":
        """Cast every parameter (in place of its data) to ``dtype``."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
            p.grad = None
        return self

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for name, m in self._modules.items():
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        for name, p in self._parameters.items():
            lines.append(f"  {name}: {p.shape}")
        return "\n".join(lines) + ")" if len(lines) > 1 else f"{type(self).__name__}()"


def persistent_buffers(module: Module) -> "OrderedDict[str, Any]":
    """Name -> array of the buffers ``module.state_dict()`` holds, in its order (the live
    arrays): what a model's state has beside its parameters."""
    return OrderedDict((name, b) for name, b, buffer in module._persistent_state() if buffer)


class ModuleList(Module):
    """A list of modules registered as ``0``, ``1``, ... (for stacks of blocks)."""

    def __init__(self, modules: list | None = None):
        super().__init__()
        for m in modules or []:
            self.append(m)

    def append(self, module: Module) -> None:
        setattr(self, str(len(self._modules)), module)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class Sequential(ModuleList):
    """Modules applied one after another."""

    def __init__(self, *modules: Module):
        super().__init__(list(modules))

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x
