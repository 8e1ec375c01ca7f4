"""Activation memory of one transformer layer: what autograd keeps for backward.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4 and Table 2. Notation: s sequence length, b micro-batch, h
hidden size, a attention heads, t tensor-parallel size. Activations are 2-byte
(fp16/bf16), dropout masks 1 byte. Per layer, in bytes:

    attention   QKV matmul input                      2sbh   (LayerNorm output)
                Q and K, for Q K^T                    4sbh
                softmax output, for dropout backward  2as^2b
                softmax dropout mask                   as^2b
                dropout output, for the product with V 2as^2b
                V                                     2sbh
                output projection input               2sbh
                dropout mask after the projection      sbh
    MLP         first linear input                    2sbh
                GELU input                            8sbh   (4h wide)
                GELU output, second linear input      8sbh
                dropout mask                           sbh
    LayerNorm   the two LayerNorm inputs              4sbh
                                              total   sbh (34 + 5 a s / h)   (eq. 1)

Table 2, per layer:

    no parallelism                        sbh (34 + 5as/h)
    tensor parallel                       sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel            sbh (34/t + 5as/(ht))
    tensor parallel + selective recompute sbh (10 + 24/t)
    tensor + sequence + selective         sbh (34/t)
    full recomputation                    2sbh            (the layer input only)

Tensor parallelism splits what lives between Megatron's f and g (Q, K, V, the
scores, the projection input, GELU in and out: 24 + 5as/h); the LayerNorm
inputs, the QKV and MLP inputs and the two dropout masks (10) stay whole unless
sequence parallelism splits them along s. Selective recomputation drops the
5as/h scores (recomputed in backward); FlashAttention never stores them in the
first place (``flash=True``), which is why the two give the same number.
Full recomputation keeps only each layer's input (split along s under sequence
parallelism: 2sbh/t; the paper's Table 2 writes 2sbh for the t = 1 case).

``minidist_layer_activation_bytes`` specialises the count to minidist's own
``nn.gpt.Block`` (its dtype, its LayerNorm and GELU ops, no dropout), the
number demos/14_cost_models_observed.py measures. See docs/cost_models.md.
"""
from __future__ import annotations

RECOMPUTE = ("none", "selective", "full")

# (term, elements per s*b*h or None for a mask, split by tensor parallelism)
# -- the sbh part of the table above; a mask is 1 byte per element
_LAYER_TERMS = (
    ("QKV matmul input", 1, False),
    ("Q and K", 2, True),
    ("V", 1, True),
    ("output projection input", 1, True),
    ("attention dropout mask", None, False),
    ("MLP first linear input", 1, False),
    ("GELU input", 4, True),
    ("GELU output", 4, True),
    ("MLP dropout mask", None, False),
    ("LayerNorm inputs", 2, False),
)


def _check(seq: int, batch: int, hidden: int, heads: int, tp: int) -> None:
    for name, value in (("seq", seq), ("batch", batch), ("hidden", hidden),
                        ("heads", heads), ("tp", tp)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def activation_memory_per_layer(seq: int, batch: int, hidden: int, heads: int, *,
                                tp: int = 1, sequence_parallel: bool = False,
                                recompute: str = "none", flash: bool = False,
                                bytes_per_element: float = 2, mask_bytes: float = 1) -> float:
    """Bytes one transformer layer keeps for backward (Korthikanti et al. 2022, Table 2).

    recompute: "none", "selective" (the attention scores are recomputed) or
    "full" (only the layer input is kept). flash=True drops the score terms as
    FlashAttention does. bytes_per_element 2 and mask_bytes 1 give the paper's
    34 and 5; in general sbh (16 e + 2 m) + a s^2 b (2 e + m) without parallelism.
    GPT-3 175B (s = 2048, b = 1, h = 12288, a = 96): 2.87 GB per layer,
    275 GB for 96 layers; with t = 8 and sequence parallelism 34.4 GB.
    """
    _check(seq, batch, hidden, heads, tp)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute is one of {RECOMPUTE}, got {recompute!r}")
    sbh = seq * batch * hidden
    shard_rest = tp if sequence_parallel else 1      # what f/g do not split, SP splits along s
    if recompute == "full":
        return bytes_per_element * sbh / shard_rest
    total = 0.0
    for _name, elements, split in _LAYER_TERMS:
        size = mask_bytes if elements is None else elements * bytes_per_element
        total += size * sbh / (tp if split else shard_rest)
    if recompute == "none" and not flash:
        # softmax output (e), its dropout mask (m), the dropout output (e): a s^2 b each
        scores = heads * seq * seq * batch
        total += (2 * bytes_per_element + mask_bytes) * scores / tp
    return total


def activation_memory_per_layer_terms(seq: int, batch: int, hidden: int,
                                      heads: int) -> dict[str, float]:
    """The sbh(34 + 5as/h) of eq. 1 term by term, in bytes (no parallelism, fp16)."""
    _check(seq, batch, hidden, heads, 1)
    sbh = seq * batch * hidden
    terms = {name: (1 if e is None else 2 * e) * sbh for name, e, _split in _LAYER_TERMS}
    terms["attention scores, mask, dropout output"] = 5 * heads * seq * seq * batch
    return terms


def minidist_layer_activation_bytes(seq: int, batch: int, hidden: int, heads: int, *,
                                    flash: bool = False, recompute: str = "none",
                                    bytes_per_element: float = 4) -> float:
    """Bytes minidist's ``nn.gpt.Block`` keeps for backward (dropout 0, default float32).

    The same count as ``activation_memory_per_layer``, term by term, for the ops
    minidist runs (elements, times bytes_per_element):

        LayerNorm x2     saves x_hat (sbh) and 1/std (sb), not its input   2sbh + 2sb
        QKV linear       its input                                          sbh
        Q, K, V          one (b, s, 3h) buffer, views of the QKV output    3sbh
        naive attention  the softmax P (as^2b); dropout 0: no mask, no copy a s^2 b
        flash attention  O (sbh) and the row logsumexp (asb) instead of P   sbh + asb
        out projection   its input (the heads side by side again)           sbh
        MLP linear 1     its input                                          sbh
        GELU (tanh form) its input and tanh(u), both 4h wide                8sbh
        MLP linear 2     its input, the GELU output                         4sbh

    20 sbh + 2 sb + a s^2 b naive, 21 sbh + 2 sb + a s b flash, against
    Megatron's 16 elements (+ 2 masks) and 2 a s^2 b (+ a mask): minidist keeps
    tanh(u) for GELU's backward (+4 sbh), and with dropout 0 stores no masks and no
    dropout output. recompute="full" (``GPTConfig(checkpoint=True)``) keeps the
    block input only: sbh. recompute="selective" (``checkpoint="selective"``:
    the results of the matmuls and attention kept, with what their backwards need)
    keeps the block input, ln_1's and ln_2's outputs, Q K V (3), the attention's
    output O and its heads merged, the attention projection's output, the MLP's
    4h-wide fc output and GELU output, the MLP projection's output: 18 sbh, and
    a s^2 b (naive: P) or a s b (flash: the logsumexp).
    """
    _check(seq, batch, hidden, heads, 1)
    if recompute not in ("none", "full", "selective"):
        raise ValueError(f"minidist's GPT recomputes 'none', 'full' or 'selective', "
                         f"got {recompute!r}")
    sbh, sb = seq * batch * hidden, seq * batch
    if recompute == "full":
        return bytes_per_element * sbh
    if recompute == "selective":
        scores = heads * sb if flash else heads * seq * sb
        return bytes_per_element * (18 * sbh + scores)
    elements = 20 * sbh + 2 * sb
    if flash:
        elements += sbh + heads * sb
    else:
        elements += heads * seq * sb
    return bytes_per_element * elements
