"""The whole parameters of a model cut by a tensor-parallel plan, on every rank."""
from minidist import backend


def whole_parameters(model) -> dict:
    """name -> the whole parameter as a host array: a plan's pieces gathered (a fused
    weight as its (3, out, in) stack), the rest as they are."""
    from minidist.distributed.tensor.parallel import parameter_as_dtensor
    modules, out = dict(model.named_modules()), {}
    for name, q in model.named_parameters():
        owner, attr = name.rsplit(".", 1) if "." in name else ("", name)
        if attr in modules[owner].__dict__.get("_dtensor_placements", {}):
            q = parameter_as_dtensor(modules[owner], attr).full_tensor()
        out[name] = backend.to_host(q.data)
    return out
