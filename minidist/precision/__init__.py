"""Low precision: exact emulated formats, autocast, loss scaling, FP8 scaling.

- ``FloatFormat`` and the presets FP16, BF16, FP8_E4M3FN, FP8_E5M2 and the fnuz
  variants, the MX types FP6_E2M3FN, FP6_E3M2FN, FP4_E2M1FN and E8M0FNU; any ExMy
  (formats.py)
- ``quantize`` (round to nearest even or stochastic, saturating or not) and its
  plain-formula oracle ``quantize_reference`` (rounding.py)
- ``encode`` / ``decode`` to and from raw bit patterns (encoding.py)
- ``autocast`` and ``autocast_matmul``: matmul-like ops in fp16 / bf16 (autocast.py)
- ``MasterWeights``: float32 master copy behind a low-precision model (master_weights.py)
- ``GradScaler``: dynamic loss scaling, PyTorch's semantics (grad_scaler.py)
- ``DelayedScaling`` / ``CurrentScaling`` and ``fp8_autocast``: FP8 with per-tensor
  scales (fp8.py)
"""
from minidist.precision.autocast import (AmpPolicy, Round, autocast, autocast_matmul,
                                        get_autocast_policy, use_policy)
from minidist.precision.encoding import decode, encode
from minidist.precision.formats import (BF16, E8M0FNU, FP4_E2M1FN, FP6_E2M3FN, FP6_E3M2FN,
                                        FP8_E4M3FN, FP8_E4M3FNUZ, FP8_E5M2, FP8_E5M2FNUZ, FP16,
                                        FP32, PRESETS, FloatFormat, get_format)
from minidist.precision.fp8 import CurrentScaling, DelayedScaling, ScalingState, fp8_autocast
from minidist.precision.grad_scaler import GradScaler
from minidist.precision.master_weights import MasterWeights
from minidist.precision.rounding import quantize, quantize_reference

__all__ = ["FloatFormat", "get_format", "PRESETS", "FP16", "BF16", "FP32", "FP8_E4M3FN",
           "FP8_E5M2", "FP8_E4M3FNUZ", "FP8_E5M2FNUZ", "FP6_E2M3FN", "FP6_E3M2FN",
           "FP4_E2M1FN", "E8M0FNU", "quantize", "quantize_reference",
           "encode", "decode", "autocast", "autocast_matmul", "get_autocast_policy", "Round",
           "AmpPolicy", "use_policy",
           "MasterWeights", "GradScaler", "DelayedScaling", "CurrentScaling", "ScalingState",
           "fp8_autocast"]
