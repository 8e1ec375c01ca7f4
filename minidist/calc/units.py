"""Units used by the cost models, and the source documents' conventions.

Every function in ``minidist.calc`` takes and returns SI base units: bytes,
seconds, bytes per second, FLOPs, FLOP/s, watts, dollars. Convert at the edge
with the constants below, e.g. ``ring_all_reduce_time(2 * GB, 8, 50 * GB)``.

The source documents write GB for 10^9 bytes (16 bytes x 7e9 params = 112 GB,
workbook 1.1), GB/s for 10^9 bytes per second, and TFLOP/s for 10^12 FLOP/s.
One place uses binary units: workbook 6.2 calls a 4096 x 8192 FP16 tensor
"64 MB", which is 64 MiB (67,108,864 bytes). Both are here, named apart.
"""
from __future__ import annotations

# decimal (what the source documents mean by KB, MB, GB, TB)
KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12

# binary
KiB = 2.0**10
MiB = 2.0**20
GiB = 2.0**30

# time
US = 1e-6            # microsecond
MS = 1e-3            # millisecond
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0

# compute
TFLOPS = 1e12        # FLOP/s
PFLOP_DAY = 1e15 * DAY   # 8.64e19 FLOPs (workbook 9.4)

# energy
KWH = 3.6e6          # joules in a kilowatt-hour
