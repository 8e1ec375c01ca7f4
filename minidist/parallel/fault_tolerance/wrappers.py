"""torchft's two wrappers: a DDP whose all-reduce is the quorum's, an optimizer that
steps only when the step commits.

    manager = Manager(load_state_dict, state_dict)
    model = DistributedDataParallel(manager, MLP(...))
    optimizer = OptimizerWrapper(manager, AdamW(model.parameters()), model)
    for x, y in batches:
        optimizer.zero_grad()             # start_quorum(): who is in, heal if behind
        loss_fn(model(x), y).backward()
        model.sync_gradients()            # p.grad = (1/Q) sum over the quorum
        optimizer.step()                  # only if should_commit()

The gradient is averaged over the Q replicas of the quorum, not the world's N: the
replicas that died this run contribute no batch, and dividing by N would shrink
every step by Q/N (docs/fault_tolerance.md).
"""
from __future__ import annotations

from typing import Any

from minidist.nn.module import Module
from minidist.optim.optimizer import Optimizer
from minidist.parallel.fault_tolerance.manager import Manager


class DistributedDataParallel(Module):
    """Wrap ``module``; ``sync_gradients()`` after backward averages every gradient over
    the quorum (``manager.allreduce``). Unlike data/ddp.py nothing is broadcast at
    construction: the manager's first quorum makes every replica alike (init_sync)."""

    def __init__(self, manager: Manager, module: Module):
        super().__init__()
        self.module = module
        self._manager = manager      # not a submodule: outside the state dict

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def sync_gradients(self) -> None:
        """Average every gradient over the quorum, one all-reduce per parameter in the
        model's order. Every parameter that requires a gradient must have one on every
        replica (as data/ddp.py asks): the replicas pair their all-reduces by order, so
        one replica's missing gradient would pair the next parameter with it."""
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        missing = [n for n, p in params if p.grad is None]
        if missing:
            raise RuntimeError(f"DistributedDataParallel: parameters {missing} received no "
                               "gradient in this backward; every parameter must take part "
                               "in the loss on every replica (unused parameters are not "
                               "supported: the quorum's all-reduces pair by order)")
        for _, p in params:
            self._manager.allreduce(p.grad)


class OptimizerWrapper(Optimizer):
    """``optimizer``, stepping only when ``manager.should_commit()``; ``zero_grad`` starts
    the step's quorum. With ``model``, every parameter it updates must be the model's:
    a replica healed with the model's state but stepping other arrays would part from
    its peers without a word.

    torchft's surface: an ``Optimizer`` whose ``param_groups`` and ``state`` are the
    wrapped optimizer's own (not copies), so that what reads or writes them through
    the wrapper reaches the optimizer that steps: an LR scheduler writing
    ``group['lr']``, ``GradScaler.unscale_`` dividing the gradients. Under a
    ``GradScaler`` a step with an inf / NaN gradient calls no ``step()``, hence no vote:
    the gradients were averaged over the quorum first, so every member sees the inf and
    skips alike. Put the scaler's ``state_dict()`` in the manager's state too: a healed
    replica with another scale would average gradients scaled differently."""

    def __init__(self, manager: Manager, optimizer: Any, model: Module | None = None):
        # no Optimizer.__init__: the groups, state and defaults are the wrapped one's
        if model is not None:
            ours = {id(p) for p in model.parameters()}
            stray = [i for i, p in enumerate(_params(optimizer)) if id(p) not in ours]
            if stray:
                raise ValueError(f"the optimizer updates parameters {stray} (in its order) "
                                 f"that are not parameters of the model {type(model).__name__}:"
                                 f" build it over model.parameters()")
        self.manager, self.optimizer = manager, optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    def add_param_group(self, group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(group)

    def zero_grad(self, set_to_none: bool = True) -> bool:
        """Start the step's quorum, then clear the gradients. False: a spare that was
        never needed (the run is over)."""
        joined = self.manager.start_quorum()
        self.optimizer.zero_grad(set_to_none)
        return joined

    def step(self, closure: Any = None) -> bool:
        """Step if every member finished the step; True if it did. No closure (as in
        torchft): it would recompute gradients after the quorum averaged them."""
        if closure is not None:
            raise ValueError("OptimizerWrapper.step takes no closure: the gradients must be "
                             "the ones averaged over the quorum (sync_gradients) before it")
        if not self.manager.should_commit():
            return False
        self.optimizer.step()
        return True

    def skip_step(self, *args: Any, **kwargs: Any) -> None:
        """A step GradScaler skips (an inf / NaN gradient, on every member alike): no
        vote, the wrapped optimizer's step-skipped hooks (DiLoCo counts the iteration)."""
        skip = getattr(self.optimizer, "skip_step", None)
        if skip is not None:
            skip(*args, **kwargs)

    def register_step_pre_hook(self, hook: Any) -> Any:
        return self.optimizer.register_step_pre_hook(hook)    # they run where it steps

    def register_step_post_hook(self, hook: Any) -> Any:
        return self.optimizer.register_step_post_hook(hook)

    def register_step_skipped_hook(self, hook: Any) -> Any:
        return self.optimizer.register_step_skipped_hook(hook)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)


def _params(optimizer: Any) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]
