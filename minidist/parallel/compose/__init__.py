"""Every dimension on one mesh: torchtitan's ``ParallelDims`` (the degrees, checked, and
the named world mesh) and ``parallelize_llama`` / ``parallelize_gpt`` (tp, cp, ep, the
pipeline and FSDP / HSDP applied in torchtitan's order on that mesh), and
``visualize_sharding``: which ranks hold which block of one of its weights.

    parallel_dims.py   the degrees, their checks, the named world mesh
    parallelize.py     parallelize_llama / parallelize_gpt: every dimension in order
    visualize.py       visualize_sharding of a composed model's weight, as text"""
from minidist.parallel.compose.parallel_dims import ParallelDims, ParallelDimsError
from minidist.parallel.compose.parallelize import (ParallelLlama, parallelize_gpt,
                                                   parallelize_llama)
from minidist.parallel.compose.visualize import visualize_sharding

__all__ = ["ParallelDims", "ParallelDimsError", "ParallelLlama", "parallelize_gpt",
           "parallelize_llama", "visualize_sharding"]
