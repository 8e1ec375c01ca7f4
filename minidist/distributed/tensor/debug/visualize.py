"""visualize_sharding: which rank holds which block of a DTensor, as text (torch's name).

For a 1-D or 2-D tensor, one line per distinct block: its rows and columns in
the global tensor and the mesh coordinates (global ranks) that hold it.
Every rank computes the same table from the placements alone (no
communication); rank 0 prints it unless ``all_ranks``.

    visualize_sharding(w)        # w: (6, 4) as [Shard(0)] on 3 ranks
    block            ranks
    [0:2, 0:4]       0
    [2:4, 0:4]       1
    [4:6, 0:4]       2
"""
from __future__ import annotations

import itertools
from typing import Any

from minidist.distributed.tensor.placement_types import local_shape_and_offset


def sharding_table(dtensor: Any) -> list[tuple[str, list[int]]]:
    """(block, ranks holding it) for every block, in order of first rank."""
    mesh = dtensor.device_mesh
    flat = []
    for coord in itertools.product(*(range(n) for n in mesh.shape)):
        shape, offset = local_shape_and_offset(dtensor.shape, mesh.shape, dtensor.placements,
                                               list(coord))
        block = ", ".join(f"{o}:{o + s}" for o, s in zip(offset, shape)) or "scalar"
        index = 0
        for c, n in zip(coord, mesh.shape):
            index = index * n + c
        flat.append((f"[{block}]", mesh._ranks[index]))
    table: dict[str, list[int]] = {}
    for block, rank in flat:
        table.setdefault(block, []).append(rank)
    return list(table.items())


def sharding_text(dtensor: Any, header: str = "") -> str:
    """The table of blocks and the ranks that hold them, as text."""
    partial = [p for p in dtensor.placements if p.is_partial()]
    lines = [header] if header else []
    lines.append(f"{'block':<24}ranks" + ("   (each holds a summand: Partial)" if partial else ""))
    for block, ranks in sharding_table(dtensor):
        lines.append(f"{block:<24}{', '.join(str(r) for r in ranks)}")
    return "\n".join(lines)


def visualize_sharding(dtensor: Any, header: str = "", all_ranks: bool = False) -> str:
    """Print (on rank 0, or on every rank) and return ``sharding_text``."""
    text = sharding_text(dtensor, header)
    if all_ranks or dtensor.device_mesh.get_rank() == 0:
        print(text)
    return text
