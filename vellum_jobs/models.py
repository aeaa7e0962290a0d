"""The app's models, where Django looks for them; they live in ``vellum_jobs.core.models``."""

from vellum_jobs.core.limit_models import LimitHold, LimitSlot
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
from vellum_jobs.core.workflow_models import Dependency, Workflow

__all__ = [
    "Dependency",
    "Job",
    "JobQuerySet",
    "LimitHold",
    "LimitSlot",
    "MaintenanceLock",
    "Queue",
    "QueueMinute",
    "Schedule",
    "UnknownName",
    "Worker",
    "Workflow",
]
