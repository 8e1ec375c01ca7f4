"""ParallelDims: the degrees of every dimension, checked, and the named world mesh they make.

    dims = ParallelDims(dp_replicate=1, dp_shard=2, cp=2, tp=1, pp=2, ep=2)   # 8 ranks
    mesh = dims.build_mesh()          # mesh["pp"], mesh["tp"], mesh["dp_cp"], mesh["ep"], ...

torchtitan's names and rules. The world is

    world = pp x dp_replicate x dp_shard x cp x tp          (outermost to innermost)

row-major, tp fastest (its all-reduces run in every layer: neighbours), pp slowest
(it sends only at stage boundaries). Expert parallelism adds no ranks: it borrows
all of cp and part of dp_shard, so dp_shard splits into

    dp_shard = dp_shard_mod_ep x dp_shard_in_ep,     ep = dp_shard_in_ep x cp

(ep must be a multiple of cp and divide dp_shard x cp). The flattened dimensions:

    name          ranks                          what runs on it
    dp            dp_replicate x dp_shard        which rows of the batch a rank reads
    dp_shard_cp   dp_shard x cp                  FSDP's shards (cp ranks hold other
                                                 tokens: their gradients are averaged too)
    dp_cp         dp_replicate x dp_shard x cp   the loss shown, the dense gradients' mean
    ep            dp_shard_in_ep x cp            the experts' all-to-alls
    dp_mod_ep     dp_replicate x dp_shard_mod_ep the ranks holding the same experts

The gradient norm adds each parameter's pieces over the dimensions that cut it
(tp, dp_shard_cp, ep) and the stages over pp (parallel/clip.py). Every check raises a
``ParallelDimsError`` naming the fix (``minidist compare`` exits 2 on it).
Docs: docs/3d_parallel.md, "Every dimension on one mesh".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")   # the mesh, outermost first
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")   # the constructor's order


class ParallelDimsError(ValueError):
    """Degrees that cannot make a mesh; the message names the fix."""


@dataclass
class ParallelDims:
    dp_replicate: int = 1       # replicas (DDP, or HSDP's replicate dimension)
    dp_shard: int = 1           # FSDP shards of every parameter
    cp: int = 1                 # context-parallel ranks cutting each sequence
    tp: int = 1                 # tensor-parallel ranks cutting each matrix
    pp: int = 1                 # pipeline stages
    ep: int = 1                 # expert-parallel ranks, borrowed from dp_shard x cp
    world_size: int | None = None   # None: any (checked against the world in build_mesh)

    def __post_init__(self):
        for name in DEGREES:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ParallelDimsError(f"{name}={value!r}: every degree is a whole number "
                                        f"of at least 1 (1: the dimension is off)")
        if self.world_size is not None and self.product != self.world_size:
            raise ParallelDimsError(self._product_message(self.world_size))
        if self.ep > 1 and (self.ep % self.cp or (self.dp_shard * self.cp) % self.ep):
            raise ParallelDimsError(
                f"ep={self.ep} borrows its ranks from dp_shard x cp = {self.dp_shard} x "
                f"{self.cp}: it must be a multiple of cp={self.cp} and divide "
                f"{self.dp_shard * self.cp}; make dp_shard x cp a multiple of ep")

    @property
    def product(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    def _product_message(self, world: int) -> str:
        product = " x ".join(f"{d}={getattr(self, d)}" for d in DIMS)
        return (f"{product} is {self.product} ranks, not the world size {world}; make the "
                f"degrees multiply to {world} (ep borrows from dp_shard x cp: it adds none)")

    # -- torchtitan's derived sizes ------------------------------------------------
    @property
    def dp_shard_in_ep(self) -> int:
        """The part of dp_shard that ep borrows (1 without ep)."""
        return self.ep // self.cp if self.ep > 1 else 1

    @property
    def dp_shard_mod_ep(self) -> int:
        """The rest of dp_shard: how many ranks of it hold the same experts."""
        return self.dp_shard // self.dp_shard_in_ep

    @property
    def fsdp_enabled(self) -> bool:
        """Whether parameters are sharded: over dp_shard x cp (cp ranks average too)."""
        return self.dp_shard * self.cp > 1

    @property
    def batch_degree(self) -> int:
        """dp: how many ways the batch's rows are split."""
        return self.dp_replicate * self.dp_shard

    @property
    def loss_degree(self) -> int:
        """dp_cp: how many ranks each hold a different share of the batch's tokens."""
        return self.dp_replicate * self.dp_shard * self.cp

    def check_model(self, config: Any, seq_len: int | None = None) -> None:
        """Refuse a model the degrees cannot cut: experts that ep does not divide, a
        sequence the zigzag layout cannot split into 2 cp chunks (x tp positions each
        under sequence parallelism), heads that tp does not divide."""
        experts = getattr(config, "num_local_experts", 0) or getattr(config, "n_expert", 0)
        moe = experts if getattr(config, "moe_every", 1) else 0
        if self.ep > 1 and not moe:
            raise ParallelDimsError(f"ep={self.ep}: the model has no MoE layers to spread; "
                                    "set ep=1, or give it experts (num_local_experts)")
        if self.ep > 1 and moe % self.ep:
            raise ParallelDimsError(f"ep={self.ep} does not divide the {moe} experts of each "
                                    f"MoE layer: choose ep dividing {moe}")
        if seq_len is not None and self.cp > 1 and seq_len % (2 * self.cp):
            raise ParallelDimsError(
                f"cp={self.cp}: the zigzag layout cuts each sequence into 2 x cp = "
                f"{2 * self.cp} chunks, and {seq_len} tokens do not split so; use a "
                f"sequence length divisible by {2 * self.cp}")

    def build_mesh(self, device_type: str | None = None) -> Any:
        """The world mesh (pp, dp_replicate, dp_shard or its two parts, cp, tp; every
        dimension present, size 1 included) with the flattened ones of the module
        docstring; every rank must call it."""
        from minidist import backend
        from minidist.comm.group import get_world_size
        from minidist.distributed.device_mesh import init_device_mesh
        world = get_world_size()
        if self.product != world:
            raise ParallelDimsError(self._product_message(world))
        names = ["pp", "dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "cp", "tp"]
        shape = [self.pp, self.dp_replicate, self.dp_shard_mod_ep, self.dp_shard_in_ep,
                 self.cp, self.tp]
        mesh = init_device_mesh(device_type or backend.device_type(), tuple(shape),
                                mesh_dim_names=tuple(names))
        mesh["dp_shard_mod_ep", "dp_shard_in_ep"]._flatten("dp_shard")
        mesh["dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep"]._flatten("dp")
        mesh["dp_shard_mod_ep", "dp_shard_in_ep", "cp"]._flatten("dp_shard_cp")
        mesh["dp_replicate", "dp_shard_mod_ep", "dp_shard_in_ep", "cp"]._flatten("dp_cp")
        if self.ep > 1:
            mesh["dp_shard_in_ep", "cp"]._flatten("ep")
        else:                                # no experts spread: this rank alone
            mesh["dp_shard_in_ep"]._flatten("ep")
        mesh["dp_replicate", "dp_shard_mod_ep"]._flatten("dp_mod_ep")
        return mesh

    def __str__(self) -> str:
        words = [f"{d}={getattr(self, d)}" for d in DEGREES if getattr(self, d) > 1]
        return " ".join(words) or "dp_replicate=1"


def degrees_of(world: int, **degrees: int) -> ParallelDims:
    """ParallelDims from keyword degrees, checked against ``world`` ranks; an unknown
    name is a ParallelDimsError listing the known ones."""
    unknown = [name for name in degrees if name not in DEGREES]
    if unknown:
        raise ParallelDimsError(f"unknown dimension {unknown[0]!r}: the dimensions are "
                                f"{', '.join(DEGREES)}")
    return ParallelDims(**degrees, world_size=world)

