"""The benchmark's job: it does nothing, so the figures are the queue's own cost."""

from __future__ import annotations

from vellum_jobs import job


@job("bench.noop")
def noop(i: int = 0) -> None:
    return None
