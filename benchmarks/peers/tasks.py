"""The no-op task for the peers built on Django's Tasks framework."""

from __future__ import annotations

from django.tasks import task


@task
def noop(i: int = 0) -> None:
    return None
