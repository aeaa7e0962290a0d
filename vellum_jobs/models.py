"""The app's models, where Django looks for them; they live in ``vellum_jobs.core.models``."""

from vellum_jobs.core.models import (
    Job,
    JobQuerySet,
    MaintenanceLock,
    Queue,
    QueueMinute,
    Schedule,
    UnknownName,
    Worker,
)

__all__ = [
    "Job",
    "JobQuerySet",
    "MaintenanceLock",
    "Queue",
    "QueueMinute",
    "Schedule",
    "UnknownName",
    "Worker",
]
