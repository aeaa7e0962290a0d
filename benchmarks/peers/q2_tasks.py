"""django-q2's tasks, imported by dotted path in its workers."""

from __future__ import annotations

import time


def noop(i: int = 0) -> None:
    return None


def stamp() -> float:
    """When a worker started it: the pickup latency is this minus the enqueue time."""
    return time.time()
