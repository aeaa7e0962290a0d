"""Pausing and resuming queues: a paused queue's jobs stay queued and no worker claims them.

The claim itself skips paused queues (a subquery on this small table, in the
same statement), so a pause holds from the next claim of every process, and
costs no query per job. Running jobs are left to finish. Resuming wakes idle
workers: PostgreSQL's by a NOTIFY, SQLite's because any write wakes them.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, router
from django.utils import timezone

from vellum_jobs.core import registry
from vellum_jobs.core.models import Job, Queue, QueueMinute, Worker
from vellum_jobs.store.announce import announce


def _alias(using: str | None) -> str:
    return using or router.db_for_write(Queue) or DEFAULT_DB_ALIAS


def pause(name: str, *, by: str = "", using: str | None = None) -> bool:
    """Stop workers from claiming jobs of queue ``name``; False if it was paused already."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a queue name must be a non-empty string, got {name!r}")
    alias = _alias(using)
    queues = Queue.objects.using(alias)
    if queues.filter(name=name, paused_at=None).update(paused_at=timezone.now(), paused_by=by):
        return True
    _, created = queues.get_or_create(name=name, defaults={"paused_at": timezone.now(), "paused_by": by})
    return created


def resume(name: str, *, using: str | None = None) -> bool:
    """Let workers claim queue ``name``'s jobs again and wake idle ones; False if it was not paused."""
    alias = _alias(using)
    resumed = bool(
        Queue.objects.using(alias)
        .filter(name=name)
        .exclude(paused_at=None)
        .update(paused_at=None, paused_by="")
    )
    if resumed:
        announce(alias, name)
    return resumed


def is_paused(name: str, *, using: str | None = None) -> bool:
    return Queue.objects.using(_alias(using)).filter(name=name).exclude(paused_at=None).exists()


def paused(*, using: str | None = None) -> list[str]:
    """The names of the paused queues, sorted."""
    rows = Queue.objects.using(_alias(using)).exclude(paused_at=None).order_by("name")
    return list(rows.values_list("name", flat=True))


def ever_used(name: str, *, using: str | None = None) -> bool:
    """Whether queue ``name`` is known: the default queue of a registered job, a job of it
    (through the ``(queue, id)`` index), a pause, a worker that serves it, or figures in the
    last day. A name that is none of these is most likely a typo, which the admin and
    ``manage.py jobs pause`` ask about before they make it a row the dashboard shows for good."""
    if any(handler.options.queue == name for handler in registry.registered()):
        return True
    alias = _alias(using)
    if Queue.objects.using(alias).filter(name=name).exists():
        return True
    if Job.objects.using(alias).filter(queue=name).order_by().exists():
        return True
    if QueueMinute.objects.using(alias).filter(queue=name).exists():
        return True
    served = Worker.objects.using(alias).values_list("queues", flat=True)
    return any(name in (queues or ()) for queues in served)
