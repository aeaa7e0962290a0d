"""How much memory this process holds: its resident set size, read cheaply at each heartbeat.

On Linux ``/proc/self/statm`` gives the resident pages now, in one small
read. Elsewhere ``resource.getrusage`` gives only the peak (kilobytes on
Linux and the BSDs, bytes on macOS), which for a long-running worker is
close enough to show growth. Windows has neither: no figure.
"""

from __future__ import annotations

import os
import sys

STATM = "/proc/self/statm"


def resident_set_size() -> int | None:
    """Bytes of memory the process holds now (or at its peak, where only that is known); None if unknown."""
    try:
        with open(STATM, "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
