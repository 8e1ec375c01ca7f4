"""Layers and models built on the autograd: ``Module``, ``Linear``, ..., ``GPT``, ``MoE``."""
from minidist.nn import functional
from minidist.nn.attention import CausalSelfAttention
from minidist.nn.gpt import GPT, Block, GPTConfig
from minidist.nn.layers import GELU, MLP, Dropout, Embedding, LayerNorm, Linear
from minidist.nn.module import Module, ModuleList, Parameter, Sequential
from minidist.nn.moe import MoE

__all__ = ["functional", "Module", "ModuleList", "Sequential", "Parameter", "Linear",
           "Embedding", "LayerNorm", "Dropout", "GELU", "MLP", "CausalSelfAttention",
           "Block", "GPT", "GPTConfig", "MoE"]
