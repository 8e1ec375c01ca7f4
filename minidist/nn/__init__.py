"""Layers and models built on the autograd: ``Module``, ``Linear``, ..., ``GPT``, ``Llama``.

Files, in reading order:
- module.py     Module, Parameter, ModuleList, Sequential
- functional.py the layer functions (torch.nn.functional's names)
- layers.py     Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, SiLU, MLP, SwiGLU
- attention.py  CausalSelfAttention (GPT-2), GroupedQueryAttention (Llama)
- rotary.py     rotary position embeddings (Hugging Face's rotate-half pairing)
- router.py, moe.py   mixture of experts
- generate.py   decoding, shared by the models
- kv_cache.py   DynamicCache: the keys and values of decoded tokens (use_cache)
- decoder.py    DecoderDims: the sizes of a model that the strategies read (config.dims())
- gpt.py        a GPT-2-shaped model
- llama.py      a Llama (Hugging Face's config and parameter names)
- hf.py         Hugging Face checkpoints in and out (config.json + safetensors)
- hf_mixtral.py Mixtral's expert tensors (per expert or fused) to the Llama's MoE names
"""
from minidist.nn import functional
from minidist.nn.attention import CausalSelfAttention, GroupedQueryAttention
from minidist.nn.gpt import GPT, Block, GPTConfig
from minidist.nn.kv_cache import DynamicCache
from minidist.nn.layers import (GELU, MLP, Dropout, Embedding, LayerNorm, Linear, RMSNorm, SiLU,
                                SwiGLU)
from minidist.nn.llama import Llama, LlamaConfig, LlamaDecoderLayer
from minidist.nn.module import Module, ModuleList, Parameter, Sequential
from minidist.nn.moe import MoE
from minidist.nn.rotary import RotaryEmbedding, apply_rotary

__all__ = ["functional", "Module", "ModuleList", "Sequential", "Parameter", "Linear",
           "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "SiLU", "MLP", "SwiGLU",
           "CausalSelfAttention", "GroupedQueryAttention", "RotaryEmbedding", "apply_rotary",
           "Block", "GPT", "GPTConfig", "Llama", "LlamaConfig", "LlamaDecoderLayer", "MoE",
           "DynamicCache"]
