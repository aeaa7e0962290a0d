"""Waiting jobs and their upstream jobs: recording an end on the edges, releasing what is ready.

Release happens exactly once, and never waits on a hot row:

- ``mark`` writes an upstream job's end state on its own edges, in the
  transaction that records the end. Each finishing job writes only its own
  edges, so a batch of 100,000 jobs has no counter row every worker updates.
- ``release`` runs in a later transaction, after that commit. It moves a
  waiting job with one conditional UPDATE (``state = 'waiting'`` and no edge
  still unended), so two processes releasing the same job change it once.
  Running after the commit is what makes it complete: when the last two
  upstream jobs end at once in two processes, each commit happens before its
  own release, so the later of the two releases sees both ends.
- ``sweep``, one worker's duty at a time, catches what the eager path missed:
  a process that died between the commit and its release, and ends written
  by other paths (recovery, an admin's cancel, workers of an older version).

Whether a job is ready reads only its own edges through the index
(``vellum_dependency_waits``): one probe for "any edge unended", one for
"any edge ended badly", whatever the batch's size.

The edges are written at enqueue by ``links``; the statements run after
every outcome batch are ``dependency_sql``'s; what a released job is handed
is ``upstream``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from vellum_jobs.core import clock, dependency_sql, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency

logger = logging.getLogger("vellum_jobs")

WAITING, CANCELLED, DONE = transitions.WAITING, transitions.CANCELLED, transitions.DONE
ENDED = transitions.FINISHED_STATES
BAD = dependency_sql.BAD

# How many waiting jobs a sweep looks at each time; the rest wait for the next.
SWEEP_LIMIT = 1000


def mark(alias: str, ended: Mapping[int, str]) -> None:
    """Write on the edges of the jobs ``ended`` (id: the state it ended in) that end.

    Only while the job is still in that state: a job retried meanwhile has
    had its edges unended (``reopen``), and an old end must not come back.
    """
    by_state: dict[str, list[int]] = {}
    for pk, state in ended.items():
        by_state.setdefault(state, []).append(pk)
    connection = connections[alias]
    with connection.cursor() as cursor:
        for state, ids in sorted(by_state.items()):
            cursor.execute(
                dependency_sql.of(connection).mark.format(ids=dependency_sql.placeholders(ids)),
                [state, *ids, state],
            )


def release_after(alias: str, upstream_ids: Iterable[int]) -> int:
    """Release (or cancel) the waiting jobs of ``upstream_ids``, whose ends committed; how many moved.

    Call it in a transaction later than the one that marked the ends (see the module docstring).
    """
    ids = list(upstream_ids)
    if not ids:
        return 0
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(
            dependency_sql.of(connection).movable.format(ids=dependency_sql.placeholders(ids)),
            [WAITING, *ids, "done", *BAD],
        )
        movable = [row[0] for row in cursor.fetchall()]
    return release(alias, movable) if movable else 0


def _movable(rows: QuerySet[Job]) -> QuerySet[Job]:
    """The waiting ``rows`` a release would move: every edge ended, or (``run_if`` "done") one ended
    badly, which cancels the job at once.

    ``release_after`` asks the same in SQL (``_Statements.movable``), before
    any transaction: the end of most jobs of a batch moves nothing (its
    callback still waits for the others), and a release would take the write
    lock (SQLite) for nothing. That read follows the commit of the ends, as
    the release does.
    """
    return rows.filter(~_unended() | (_ended_badly() & Q(run_if="done")), state=WAITING)


def release(alias: str, candidates: QuerySet[Any, Any] | Iterable[int]) -> int:
    """Move the ``candidates`` that are waiting and whose edges allow it; how many moved.

    A job cancelled here ends too: its own downstream jobs are looked at in turn.
    """
    moved = 0
    with transaction.atomic(using=alias):
        while True:
            now = clock.of(alias)
            rows = Job.objects.using(alias).filter(pk__in=candidates, state=WAITING)
            moved += _queue_ready(rows, now)
            cancelled = _cancel_blocked(alias, rows, now)
            if not cancelled:
                return moved
            moved += len(cancelled)
            mark(alias, dict.fromkeys(cancelled, CANCELLED))
            candidates = list(
                Dependency.objects.using(alias)
                .filter(upstream_id__in=cancelled)
                .values_list("job_id", flat=True)
            )


def _unended() -> Exists:
    return Exists(Dependency.objects.filter(job=OuterRef("pk"), upstream_state=""))


def _ended_badly() -> Exists:
    return Exists(Dependency.objects.filter(job=OuterRef("pk"), upstream_state__in=BAD))


def _queue_ready(rows: QuerySet[Job], now: object) -> int:
    """Queue the jobs whose upstream jobs all ended, as their ``run_if`` asks."""
    ended = rows.filter(~_unended())
    ready = (
        ended.filter(run_if="finished")
        | ended.filter(~_ended_badly(), run_if="done")
        | ended.filter(_ended_badly(), run_if="failed")
    )
    return ready.update(**transitions.orm(transitions.released(now)))  # type: ignore[arg-type]


def _cancel_blocked(alias: str, rows: QuerySet[Job], now: object) -> list[int]:
    """Cancel the jobs that will never run: run_if "done" with an upstream job that did not end
    done (at once), run_if "failed" once all ended done. Returns the ids cancelled here."""
    blocked = rows.filter(_ended_badly(), run_if="done") | rows.filter(
        ~_unended(), ~_ended_badly(), run_if="failed"
    )
    cancelled = []
    for pk in blocked.values_list("pk", flat=True):
        changes = transitions.upstream_ended(now, _reason(alias, pk))  # type: ignore[arg-type]
        if rows.filter(pk=pk).update(**transitions.orm(changes)):
            cancelled.append(pk)
    return cancelled


def _reason(alias: str, pk: int) -> str:
    """Why job ``pk`` will not run: its first upstream job that did not end done, or that all did."""
    edge = (
        Dependency.objects.using(alias)
        .filter(job_id=pk, upstream_state__in=BAD)
        .order_by("position", "upstream_id")
        .values_list("upstream_id", "upstream_state")
        .first()
    )
    if edge is None:
        return f"{transitions.UPSTREAM_REASON}every upstream job ended done, and it runs only if one did not"
    upstream_id, state = edge
    return f"{transitions.UPSTREAM_REASON}job #{upstream_id} ended {state}, so this job will not run"


def reopen(alias: str, retried: Iterable[int]) -> int:
    """Jobs ``retried`` run again: their edges are unended, and the jobs downstream of them that
    their end cancelled wait again (all the way down). Returns how many waited again."""
    pending, count = list(retried), 0
    while pending:
        Dependency.objects.using(alias).filter(upstream_id__in=pending).update(upstream_state="")
        downstream = Dependency.objects.using(alias).filter(upstream_id__in=pending).values("job_id")
        rows = Job.objects.using(alias).filter(transitions.reopenable(), pk__in=downstream)
        pending = list(rows.values_list("pk", flat=True))
        count += (
            Job.objects.using(alias)
            .filter(transitions.reopenable(), pk__in=pending)
            .update(**transitions.reopened())
        )
    return count


def sweep(alias: str) -> int:
    """The release duty: mark the ends the eager path missed, then release what is ready; how many
    jobs moved."""
    with transaction.atomic(using=alias):
        _mark_missed(alias)
    stuck = _movable(Job.objects.using(alias))
    ids = list(stuck.order_by("pk").values_list("pk", flat=True)[:SWEEP_LIMIT])
    return release(alias, ids) if ids else 0


def _mark_missed(alias: str) -> None:
    """Edges of waiting jobs still unended whose upstream job ended, or no longer exists (pruned or
    deleted: it counts as cancelled)."""
    unended = Dependency.objects.using(alias).filter(job__state=WAITING, upstream_state="")
    ended = dict(
        unended.filter(upstream__state__in=ENDED)
        .values_list("upstream_id", "upstream__state")
        .distinct()[:SWEEP_LIMIT]
    )
    if ended:
        logger.info("release duty: %d upstream jobs' ends recorded late count=%d", len(ended), len(ended))
        mark(alias, ended)
    gone = unended.filter(~Exists(Job.objects.filter(pk=OuterRef("upstream_id"))))
    gone_ids = list(gone.values_list("pk", flat=True)[:SWEEP_LIMIT])
    if gone_ids:
        Dependency.objects.using(alias).filter(pk__in=gone_ids).update(upstream_state=CANCELLED)
