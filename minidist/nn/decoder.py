"""What a strategy reads of a decoder-only model's config: one record, ``config.dims()``.

The strategies meet a model through its ``blocks``, ``embed(idx)``, ``head(x,
targets)`` and ``stage_ends()``, and read its sizes here, so that the GPT
(nanoGPT's names: ``n_embd``, ``tie_weights``) and the Llama (Hugging Face's:
``hidden_size``, ``tie_word_embeddings``) each keep their own names:

    GPTConfig(...).dims()   == DecoderDims(width=n_embd, layers=n_layer, heads=n_head,
                                           positions=block_size, tied=tie_weights)
    LlamaConfig(...).dims() == DecoderDims(width=hidden_size, layers=num_hidden_layers,
                                           heads=num_attention_heads,
                                           positions=max_position_embeddings,
                                           tied=tie_word_embeddings)
"""
from __future__ import annotations

from typing import NamedTuple


class DecoderDims(NamedTuple):
    """The sizes of a decoder-only model that the strategies read."""
    width: int       # C: the residual stream's features, what passes between pipeline stages
    layers: int      # decoder blocks
    heads: int       # attention (query) heads per block
    positions: int   # the longest sequence the model takes
    tied: bool       # lm_head shares the token embedding's matrix
