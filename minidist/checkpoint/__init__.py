"""Checkpoints: save and resume training, atomically, sharded per rank for ZeRO.

- io.py       atomic file writes (temp file, fsync, rename), checksums, ``CheckpointError``
- single.py   ``save_checkpoint`` / ``load_checkpoint``: one file with model, optimizer,
              sampler and RNG state (one process, or DDP where rank 0 writes)
- sharded.py  ``save_sharded`` / ``load_sharded``: each rank writes its ZeRO shard, a
              manifest with sizes and sha256s; loading at another world size reshards
"""
from minidist.checkpoint.io import CheckpointError, atomic_write_bytes, load_file, save_file
from minidist.checkpoint.sharded import load_sharded, read_manifest, save_sharded
from minidist.checkpoint.single import load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "atomic_write_bytes", "save_file", "load_file",
           "save_checkpoint", "load_checkpoint", "save_sharded", "load_sharded",
           "read_manifest"]
