"""Checkpoints: save and resume training, atomically, sharded per rank for ZeRO.

Files, in reading order:

- tree.py     a state dict as JSON (names, plain values, tagged tuples / int keys / big
              ints / nan) plus a list of arrays: data only, bit for bit
- records.py  the file: a zip archive of .npy records (read with allow_pickle=False)
              beside checkpoint.json (the structure; dtype, shape, sha256 per record)
- safetensors_file.py  the same, as a safetensors file (a path ending in .safetensors),
              where the safetensors package is installed
- io.py       atomic file writes (temp file, fsync, rename), checksums, ``CheckpointError``;
              ``save_file`` / ``load_file``, which never unpickle
- single.py   ``save_checkpoint`` / ``load_checkpoint``: one file with model, optimizer,
              sampler and RNG state (one process, or DDP where rank 0 writes)
- sharded.py  ``save_sharded`` / ``load_sharded``: each rank writes its ZeRO shard, a
              manifest with sizes and sha256s; loading at another world size reshards
- pipeline.py ``save_pipeline`` / ``load_pipeline``: a pipelined (3D) model, each stage
              its part; loading at another pipeline degree takes each name from its file
- dtensor.py  ``save_dtensors`` / ``load_dtensors``: a state dict of DTensors (fully_shard's
              ``sharded_state_dict``, a parallelize_module model's ``state_dict()``), each
              rank its pieces; loading at another world size reads only the pieces that
              overlap
- convert.py  ``minidist checkpoint convert OLD NEW --trust-pickle``: the one way to read
              the old pickled format, for a checkpoint one trusts

Docs: docs/checkpoints.md. Demo: demos/12_checkpoints.py. Tests: tests/checkpoint/.
"""
from minidist.checkpoint.io import CheckpointError, atomic_write_bytes, load_file, save_file
from minidist.checkpoint.pipeline import load_pipeline, save_pipeline
from minidist.checkpoint.sharded import load_sharded, read_manifest, save_sharded
from minidist.checkpoint.single import load_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "atomic_write_bytes", "save_file", "load_file",
           "save_checkpoint", "load_checkpoint", "save_sharded", "load_sharded",
           "save_pipeline", "load_pipeline",
           "read_manifest"]
