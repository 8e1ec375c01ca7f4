"""A unit's parameters by the names the model gives them (torch's ``FSDPParam._param_fqn``).

A unit is made from one module, so it first names its parameters from there
(``c_proj.weight``); each fully_shard of a module around it names them again from the
outer module, through the pieces now set in its modules (``blocks.1.attn.c_proj.weight``),
so the outermost (the root) names them as the model's ``named_parameters`` does. The
errors that name a unit's parameters read them here (post_backward.py).
"""
from __future__ import annotations

from minidist.nn.module import Module


def qualify_names(module: Module) -> None:
    """Every unit in ``module``'s subtree names its parameters from ``module``."""
    names = {id(p): n for n, p in module.named_parameters()}   # the pieces, set in place
    for m in module.modules():
        state = m.__dict__.get("_fsdp_state")
        if state is not None:
            state.params[:] = [p._replace(fqn=names.get(id(p.shard), p.fqn))
                               for p in state.params]
