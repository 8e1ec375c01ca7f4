"""Low precision: exact emulated formats, autocast, loss scaling, FP8 scaling.

- ``FloatFormat`` and the presets FP16, BF16, FP8_E4M3FN, FP8_E5M2 and the fnuz
  variants, the MX types FP6_E2M3FN, FP6_E3M2FN, FP4_E2M1FN and E8M0FNU; any ExMy
  (formats.py)
- ``quantize`` (round to nearest even or stochastic, saturating or not) and its
  plain-formula oracle ``quantize_reference`` (rounding.py)
- ``encode`` / ``decode`` to and from raw bit patterns (encoding.py)
- ``autocast`` and ``autocast_matmul``: matmul-like ops in fp16 / bf16; ``capture_policy``:
  the active policy, re-entered by a recompute in backward (autocast.py)
- ``MasterWeights``: float32 master copy behind a low-precision model (master_weights.py)
- ``GradScaler``: dynamic loss scaling, PyTorch's semantics (grad_scaler.py)
- ``DelayedScaling`` / ``CurrentScaling`` and ``fp8_autocast``: FP8 with per-tensor
  scales (fp8.py)
- block scaling: cutting an axis into blocks (block_layout.py); ``mx_quantize`` /
  ``mx_dequantize``, OCP MX v1.0, a power-of-two scale per 32 (mx.py);
  ``nvfp4_quantize`` / ``nvfp4_dequantize``, an E4M3 scale per 16 FP4 under an FP32
  tensor scale (nvfp4.py); ``blockwise_fp8_quantize`` / ``_dequantize``,
  DeepSeek-V3's 1x128 / 128x128 FP8 (blockwise_fp8.py)
- ``BlockScaledTensor``: elements with their scales, bits per element (block_tensor.py)
- ``BlockScaling`` / ``block_autocast``: Linears whose forward and backward matmuls
  run on block-quantized operands, recipes mxfp8, mxfp4, nvfp4, fp8_blockwise, with
  NVFP4's stochastic rounding and random Hadamard options (block_linear.py)
"""
from minidist.precision.autocast import (AmpPolicy, Round, autocast, autocast_matmul,
                                        capture_policy, get_autocast_policy, use_policy)
from minidist.precision.encoding import decode, encode
from minidist.precision.formats import (BF16, E8M0FNU, FP4_E2M1FN, FP4_E3M0, FP6_E2M3FN,
                                        FP6_E3M2FN, FP8_E4M3FN, FP8_E4M3FNUZ, FP8_E5M2, FP8_E5M2FNUZ, FP16,
                                        FP32, PRESETS, FloatFormat, get_format)
from minidist.precision.block_linear import BlockScaling, block_autocast
from minidist.precision.block_tensor import BlockScaledTensor
from minidist.precision.blockwise_fp8 import blockwise_fp8_dequantize, blockwise_fp8_quantize
from minidist.precision.fp8 import CurrentScaling, DelayedScaling, ScalingState, fp8_autocast
from minidist.precision.grad_scaler import GradScaler
from minidist.precision.master_weights import MasterWeights
from minidist.precision.mx import mx_dequantize, mx_quantize
from minidist.precision.nvfp4 import nvfp4_dequantize, nvfp4_quantize
from minidist.precision.rounding import quantize, quantize_reference

__all__ = ["FloatFormat", "get_format", "PRESETS", "FP16", "BF16", "FP32", "FP8_E4M3FN",
           "FP8_E5M2", "FP8_E4M3FNUZ", "FP8_E5M2FNUZ", "FP6_E2M3FN", "FP6_E3M2FN",
           "FP4_E2M1FN", "FP4_E3M0", "E8M0FNU", "quantize", "quantize_reference",
           "encode", "decode", "autocast", "autocast_matmul", "get_autocast_policy", "Round",
           "AmpPolicy", "use_policy", "capture_policy",
           "MasterWeights", "GradScaler", "DelayedScaling", "CurrentScaling", "ScalingState",
           "fp8_autocast", "mx_quantize", "mx_dequantize", "nvfp4_quantize", "nvfp4_dequantize",
           "blockwise_fp8_quantize", "blockwise_fp8_dequantize", "BlockScaling",
           "block_autocast", "BlockScaledTensor"]
