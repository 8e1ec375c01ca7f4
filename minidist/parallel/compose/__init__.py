"""Every dimension on one mesh: torchtitan's ``ParallelDims`` (the degrees, checked, and
the named world mesh) and ``parallelize_llama`` / ``parallelize_gpt`` (tp, cp, ep, the
pipeline and FSDP / HSDP applied in torchtitan's order on that mesh)."""
from minidist.parallel.compose.parallel_dims import ParallelDims, ParallelDimsError
from minidist.parallel.compose.parallelize import (ParallelLlama, parallelize_gpt,
                                                   parallelize_llama)

__all__ = ["ParallelDims", "ParallelDimsError", "ParallelLlama", "parallelize_gpt",
           "parallelize_llama"]
