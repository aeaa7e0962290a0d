"""Which of the ``HEALTH`` conditions the queue's figures fail, and what is worth a look, in words."""

from __future__ import annotations

from vellum_jobs.conf import Health, describe_duration
from vellum_jobs.core import clock
from vellum_jobs.observe.figures import Figures, OldestDue


def waited_too_long(figures: Figures, health: Health) -> bool:
    """Whether a due job of a queue that is not paused has waited past ``MAX_QUEUED_AGE``."""
    age = figures["oldest_queued_age"]
    return health.max_queued_age is not None and age is not None and age > health.max_queued_age


def problems(figures: Figures, health: Health, oldest: OldestDue | None = None) -> list[str]:
    """The failed conditions, each a sentence; empty when the queue is healthy.

    ``oldest`` names the job that waited too long, where it was read.
    """
    found = []
    workers = figures["workers"]
    if health.require_worker and not workers["alive"]:
        stale = f" ({workers['stale']} stale)" if workers["stale"] else ""
        found.append(f"no live worker{stale}; REQUIRE_WORKER is on")
    if waited_too_long(figures, health):
        assert health.max_queued_age is not None
        limit = f"(limit {describe_duration(health.max_queued_age)}, MAX_QUEUED_AGE)"
        waited = describe_duration(figures["oldest_queued_age"] or 0)
        found.append(f"{oldest} {limit}" if oldest else f"the oldest due job has waited {waited} {limit}")
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
