"""Seeing placements: CommDebugMode (the collectives a region issues, by phase) and
visualize_sharding (which rank holds which block).

    comm_mode.py    CommDebugMode
    visualize.py    visualize_sharding, sharding_text, sharding_table
"""
from minidist.distributed.tensor.debug.comm_mode import CommDebugMode
from minidist.distributed.tensor.debug.visualize import (sharding_table, sharding_text,
                                                        visualize_sharding)

__all__ = ["CommDebugMode", "visualize_sharding", "sharding_text", "sharding_table"]
