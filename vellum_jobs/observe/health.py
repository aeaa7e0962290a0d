"""Which of the ``HEALTH`` conditions the queue's figures fail, and what is worth a look, in words."""

from __future__ import annotations

from vellum_jobs.conf import Health
from vellum_jobs.core import clock
from vellum_jobs.observe.figures import Figures


def problems(figures: Figures, health: Health) -> list[str]:
    """The failed conditions, each a sentence; empty when the queue is healthy."""
    found = []
    workers = figures["workers"]
    if health.require_worker and not workers["alive"]:
        stale = f" ({workers['stale']} stale)" if workers["stale"] else ""
        found.append(f"no live worker{stale}; REQUIRE_WORKER is on")
    age = figures["oldest_queued_age"]
    if health.max_queued_age is not None and age is not None and age > health.max_queued_age:
        found.append(
            f"the oldest due job has waited {age:g}s, longer than MAX_QUEUED_AGE ({health.max_queued_age:g}s)"
        )
    return found


def warnings(figures: Figures) -> list[str]:
    """What an operator should look at though jobs still run: hosts whose clock is off the database's.

    Not a failed condition: no lease depends on a clock, but the due times a
    host's enqueues and retries write are off by as much as its clock.
    """
    return [
        f"worker {off} (more than {clock.WARN_OFFSET:g}s: the due times it writes are off by as much)"
        for off in figures["workers"]["clocks_off"]
    ]
