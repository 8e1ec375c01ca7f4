"""Shared by the attention tests: random inputs, and running an op forward + backward."""
import numpy as np
from hypothesis import strategies as st

from minidist import backend
from minidist.autograd import Tensor
from oracles.optional import require


@st.composite
def attention_case(draw, masks=True, max_len=40):
    """Shapes, options and a seed for one attention call (mask kinds drawn too)."""
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))  # batch, heads
    case = dict(lead=lead, lq=draw(st.integers(1, max_len)), lk=draw(st.integers(1, max_len)),
                e=draw(st.integers(1, 12)), ev=draw(st.integers(1, 12)),
                causal=draw(st.booleans()), mask=None,
                block_q=draw(st.integers(1, 24)), block_k=draw(st.integers(1, 24)),
                dropout=draw(st.sampled_from([0.0, 0.0, 0.3])), seed=draw(st.integers(0, 2**20)))
    if masks and not case["causal"]:
        case["mask"] = draw(st.sampled_from([None, "bool", "float", "bool_rows"]))
    return case


def make_inputs(case, dtype="float64"):
    """Host arrays q, k, v, dO and the mask (or None) of a case."""
    rng = np.random.default_rng(case["seed"])
    lead, lq, lk = case["lead"], case["lq"], case["lk"]
    q = rng.standard_normal(lead + (lq, case["e"]))
    k = rng.standard_normal(lead + (lk, case["e"]))
    v = rng.standard_normal(lead + (lk, case["ev"]))
    do = rng.standard_normal(lead + (lq, case["ev"]))
    mask = None
    if case["mask"] == "bool":           # broadcast over the batch dims
        mask = rng.random((lq, lk)) > 0.4
    elif case["mask"] == "bool_rows":    # some rows see no key at all
        mask = rng.random(lead + (lq, lk)) > 0.3
        mask[..., ::3, :] = False
    elif case["mask"] == "float":
        mask = rng.standard_normal(lead[-1:] + (lq, lk))
        mask[..., 1::4, :] = -np.inf
    if mask is not None and mask.dtype != bool:
        mask = mask.astype(dtype)
    return [a.astype(dtype) for a in (q, k, v, do)], mask


def run(op, arrays, mask, case, **options):
    """op(q, k, v) forward and backward on the active backend -> host (O, dq, dk, dv)."""
    q, k, v, do = (backend.from_host(a) for a in arrays)
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    m = None if mask is None else backend.from_host(mask)
    out = op(qt, kt, vt, attn_mask=m, dropout_p=case["dropout"], is_causal=case["causal"],
             generator=backend.Generator(case["seed"]), **options)
    out.backward(do)
    return [backend.to_host(a) for a in (out.data, qt.grad, kt.grad, vt.grad)]


def run_torch(arrays, mask, case):
    """PyTorch's scaled_dot_product_attention forward and backward -> (O, dq, dk, dv);
    a skip where PyTorch is not installed."""
    torch = require("torch")
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else torch.tensor(mask),
        is_causal=case["causal"])
    out.backward(torch.tensor(arrays[3]))
    return [t.detach().numpy() for t in (out, q.grad, k.grad, v.grad)]
