"""Hugging Face Llama checkpoints in and out: ``config.json`` + safetensors, nothing pickled.

    directory/config.json                           LlamaConfig's names (rope_parameters too;
                                                    Mixtral's MoE names, nn/hf_mixtral.py)
    directory/model.safetensors                     one file, or
    directory/model.safetensors.index.json          {"weight_map": {name: file}} and
    directory/model-00001-of-00002.safetensors ...  the shards it names

The tensors are read with the ``safetensors`` package's NumPy API (``safe_open(...,
framework="np")``), which parses a JSON header and copies raw bytes: it never runs
code from the file, as unpickling would. The package is an optional extra
(``pip install -e ".[hf]"``); the core of minidist stays NumPy-only. bfloat16 tensors
(how Llama checkpoints ship) are read through ml_dtypes' NumPy type and widened to
float32, exactly: a bfloat16 checkpoint loads as a float32 model unless ``dtype`` says
otherwise (minidist.precision emulates bf16 arithmetic, it does not store it).

Loading is all or nothing, and checks before it allocates: ``config.json`` and the
index are read as minidist/untrusted.py reads a file (no link, regular, at most
64 MiB), the index's file names must be plain names inside the directory, and every
safetensors header (dtype, shape, byte range inside its file) is compared with the
model the config describes (``Llama.parameter_shapes``: each expected name present,
a float, of its shape; none unexpected) before the model is built or a tensor read,
so a tiny directory whose config claims terabytes is refused naming its first
mismatching tensor. The tensors read are checked again, and every problem is named
with its tensor.
"""
from __future__ import annotations

import json
import os
from typing import Any

from minidist import backend
from minidist.backend import xp
from minidist.nn.hf_mixtral import (FUSED, check_mixtral_config, from_mixtral_names,
                                    to_mixtral_names)
from minidist.nn.safetensors_header import (FLOATS, IGNORED_SUFFIXES, CheckpointMismatch,
                                            TensorHeader, check_headers, read_header)
from minidist.untrusted import MAX_JSON_BYTES, Refused, confined_name, read_regular

# the same tensors (Mistral adds a window; Mixtral's MoE experts: nn/hf_mixtral.py)
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
MODEL_TYPES = ("llama", "mistral", "mixtral")
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD_FILE = r"[^/\\]+\.safetensors"   # a file an index may name: a plain name in the directory


def _safetensors() -> Any:
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, for bf16 checkpoints)
    except ImportError:
        pass
    try:
        import safetensors.numpy  # noqa: F401  (the submodule the save uses)
        from safetensors import safe_open
    except ImportError:
        raise ImportError("reading and writing Hugging Face checkpoints needs the safetensors "
                          "package: pip install -e \".[hf]\" (or pip install safetensors)") \
            from None
    return safe_open


# -- config ----------------------------------------------------------------------------

def config_from_hf(hf: dict, dtype: str | None, config_class: Any) -> Any:
    """A ``config_class`` (``LlamaConfig``, which llama.py passes: it imports this
    module) from the dict of a Hugging Face ``config.json``."""
    archs = hf.get("architectures") or []
    if hf.get("model_type") not in MODEL_TYPES or (archs and archs[0] not in ARCHITECTURES):
        raise CheckpointMismatch(
            f"unsupported architecture {archs or hf.get('model_type')!r}: minidist loads "
            f"{', '.join(ARCHITECTURES)} (model_type {' or '.join(MODEL_TYPES)})")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointMismatch(f"hidden_act {hf['hidden_act']!r}: the Llama MLP here is SiLU")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointMismatch(f"rope_type {rope_type!r} (scaled rotary embeddings) is not "
                                 f"supported; only the default rotary embedding is")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    window = hf.get("sliding_window") if hf.get("use_sliding_window", True) else None
    moe = {}
    if hf.get("model_type") == "mixtral":
        if hf.get("router_jitter_noise", 0.0):
            raise CheckpointMismatch(f"router_jitter_noise={hf['router_jitter_noise']}: the "
                                     f"router here has no jitter; set it to 0.0")
        # transformers adds its (differently pooled) balancing loss only when asked to
        coef = hf.get("router_aux_loss_coef", 0.0) if hf.get("output_router_logits") else 0.0
        moe = dict(num_local_experts=hf["num_local_experts"],
                   num_experts_per_tok=hf.get("num_experts_per_tok", 2),
                   router_aux_loss_coef=coef)
    cfg = config_class(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        num_key_value_heads=hf.get("num_key_value_heads"), head_dim=hf.get("head_dim"),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        attention_bias=hf.get("attention_bias", False), mlp_bias=hf.get("mlp_bias", False),
        sliding_window=window, initializer_range=hf.get("initializer_range", 0.02),
        dtype=dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32", **moe)
    if moe:
        try:
            check_mixtral_config(cfg)
        except ValueError as err:
            raise CheckpointMismatch(f"this Mixtral config is not supported: {err}") from None
    return cfg


def config_to_hf(cfg: Any) -> dict:
    """The ``config.json`` dict that ``transformers``' ``LlamaConfig`` reads back."""
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "dtype": cfg.dtype, "rope_parameters": {"rope_theta": cfg.rope_theta,
                                                    "rope_type": "default"},
           "rope_theta": cfg.rope_theta}
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                 "max_position_embeddings", "tie_word_embeddings", "attention_bias",
                 "mlp_bias", "initializer_range"):
        out[name] = getattr(cfg, name)
    if cfg.sliding_window is not None:
        out.update(architectures=["MistralForCausalLM"], model_type="mistral",
                   sliding_window=cfg.sliding_window)
    if cfg.num_local_experts:
        out.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                   sliding_window=cfg.sliding_window, num_local_experts=cfg.num_local_experts,
                   num_experts_per_tok=cfg.num_experts_per_tok, router_jitter_noise=0.0,
                   router_aux_loss_coef=cfg.router_aux_loss_coef,
                   output_router_logits=bool(cfg.router_aux_loss_coef))
    return out


# -- tensors -----------------------------------------------------------------------------

def _read_json(path: str) -> Any:
    """A JSON file of the checkpoint, read as minidist/untrusted.py reads one."""
    try:
        return json.loads(read_regular(path, MAX_JSON_BYTES, "JSON file"))
    except Refused as err:
        raise CheckpointMismatch(str(err)) from None
    except (ValueError, RecursionError) as err:
        raise CheckpointMismatch(f"{path} is not JSON: {err}") from None


def _files(directory: str) -> dict[str, list[str]]:
    """file -> the tensor names it should hold (None: whatever the single file holds)."""
    index = os.path.join(directory, INDEX)
    if os.path.lexists(index):
        weight_map = _read_json(index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointMismatch(f"{index} has no \"weight_map\" {{tensor: file}}")
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            try:
                confined_name(directory, file, SHARD_FILE, index)
            except Refused as err:
                raise CheckpointMismatch(str(err)) from None
            files.setdefault(file, []).append(name)
        return files
    if os.path.exists(os.path.join(directory, SINGLE)):
        return {SINGLE: None}
    raise FileNotFoundError(f"{directory} holds neither {SINGLE} nor {INDEX}: is it a "
                            f"Hugging Face checkpoint directory (save_pretrained's output)?")


def read_tensors(directory: str) -> dict[str, Any]:
    """Every tensor of the checkpoint, as host arrays, by name (NumPy API, no pickle)."""
    safe_open = _safetensors()
    tensors: dict[str, Any] = {}
    for file, names in _files(directory).items():
        path = os.path.join(directory, file)
        try:
            with safe_open(path, framework="np") as f:
                keys = list(f.keys())
                for name in (keys if names is None else names):
                    if name not in keys:
                        raise CheckpointMismatch(f"tensor {name!r}: the index places it in "
                                                 f"{file}, which does not hold it")
                    tensors[name] = f.get_tensor(name)
        except CheckpointMismatch:
            raise
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: named by {INDEX} but missing") from None
        except TypeError as err:          # bfloat16 without ml_dtypes: NumPy has no type
            raise CheckpointMismatch(f"{path}: the NumPy API cannot read a tensor ({err}); "
                                     f"bfloat16 tensors need ml_dtypes (pip install "
                                     f"ml_dtypes, part of the hf extra)") from None
        except Exception as err:          # safetensors' own error: truncated, bad header
            raise CheckpointMismatch(f"{path} is truncated or corrupt: {err}") from None
    return tensors


def read_headers(directory: str) -> dict[str, TensorHeader]:
    """Every tensor's header, by name, each placed where the index says."""
    headers: dict[str, TensorHeader] = {}
    for file, names in _files(directory).items():
        found = read_header(os.path.join(directory, file))
        for name in (found if names is None else names):
            if name not in found:
                raise CheckpointMismatch(f"tensor {name!r}: the index places it in {file}, "
                                         f"which does not hold it")
            headers[name] = found[name]
    return headers


def check_tensors(model: Any, tensors: dict[str, Any]) -> None:
    """Raise ``CheckpointMismatch`` naming every missing, unexpected or misshapen tensor."""
    own = dict(model.named_parameters())
    problems = []
    for name, p in own.items():
        if name not in tensors:
            problems.append(f"missing tensor {name!r} (expected shape {p.shape})")
        elif tuple(tensors[name].shape) != p.shape:
            problems.append(f"tensor {name!r}: expected shape {p.shape}, found "
                            f"{tuple(tensors[name].shape)}")
    for name in tensors:
        tied_head = name == "lm_head.weight" and model.config.tie_word_embeddings
        if name not in own and not tied_head and not name.endswith(IGNORED_SUFFIXES):
            problems.append(f"unexpected tensor {name!r} (shape {tuple(tensors[name].shape)})")
    if problems:
        raise CheckpointMismatch("the checkpoint does not fit the model of its config.json: "
                                 + "; ".join(problems))


def load_llama(cls: type, directory: str, dtype: str | None = None, *,
               config_class: Any) -> Any:
    """``cls`` (Llama) built from ``directory``'s config (a ``config_class``:
    LlamaConfig), every tensor checked, then copied."""
    _safetensors()                                    # the extra first, before any work
    path = os.path.join(directory, "config.json")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path} not found: a Hugging Face checkpoint directory holds "
                                f"config.json beside its safetensors")
    hf = _read_json(path)
    if not isinstance(hf, dict):
        raise CheckpointMismatch(f"{path} is not a JSON object")
    headers = read_headers(directory)
    if dtype is None:                                 # the checkpoint's own dtype
        dtype = hf.get("dtype") or hf.get("torch_dtype")
        if dtype is None and headers:
            dtype = FLOATS.get(next(iter(headers.values())).dtype)
        if dtype == "bfloat16":
            dtype = "float32"                         # exact widening (module docstring)
    if dtype not in ("float16", "float32", "float64"):
        raise ValueError(f"dtype {dtype!r}: a model here is float16, float32 or float64 "
                         f"(bfloat16 checkpoints load as float32)")
    try:
        cfg = config_from_hf(hf, dtype, config_class)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointMismatch(f"{path} does not describe a model: "
                                 f"{type(err).__name__}: {err}") from None
    # every header against the config before anything is built or read (a 174-byte
    # directory may claim a model of terabytes)
    if cfg.num_local_experts:
        for name, found in headers.items():           # (unfusing E experts loops E times)
            if FUSED.match(name) and found.shape[:1] != (cfg.num_local_experts,):
                raise CheckpointMismatch(f"tensor {name!r}: {found.shape}, expected "
                                         f"{cfg.num_local_experts} experts first")
        headers = from_mixtral_names(headers)
    check_headers(cls.parameter_shapes(cfg), headers, cfg.tie_word_embeddings)
    tensors = read_tensors(directory)
    model = cls(cfg)
    if model.config.num_local_experts:
        tensors = from_mixtral_names(tensors)
    check_tensors(model, tensors)
    for name, p in model.named_parameters():          # widened on the host, then moved
        p.data = backend.from_host(tensors[name].astype(str(p.dtype)))
    return model


def save_llama(model: Any, directory: str) -> None:
    """``config.json`` and ``model.safetensors`` (a tied head is saved once, as its
    embedding, which is what ``transformers`` writes and expects)."""
    _safetensors()
    if model.config.num_local_experts:
        check_mixtral_config(model.config)         # before anything is written
    from safetensors.numpy import save_file
    os.makedirs(directory, exist_ok=True)
    tensors = {name: backend.to_host(xp.ascontiguousarray(p.data))
               for name, p in model.named_parameters()}
    if model.config.num_local_experts:
        tensors = to_mixtral_names(tensors)
    save_file(tensors, os.path.join(directory, SINGLE), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config_to_hf(model.config), f, indent=2)
