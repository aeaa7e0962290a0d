"""Making jobs wait for others: the edges an enqueue writes (``Dependency`` rows)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from django.db import connections

from vellum_jobs.core import transitions
from vellum_jobs.core.dependency_sql import columns
from vellum_jobs.core.models import Job
from vellum_jobs.core.upstream import COUNTS
from vellum_jobs.core.workflow_models import Dependency

ENDED = transitions.FINISHED_STATES


def link(alias: str, jobs: Iterable[int], upstream: Mapping[int, str], chunk: int = 1000) -> None:
    """Make each of ``jobs`` wait for ``upstream`` (id: its state now), in that order; an upstream
    job that has ended already is marked so."""
    states = {pk: (state if state in ENDED else "") for pk, state in upstream.items()}
    edges = [
        Dependency(job_id=job, upstream_id=pk, position=i, upstream_state=state)
        for job in jobs
        for i, (pk, state) in enumerate(states.items())
    ]
    Dependency.objects.using(alias).bulk_create(edges, batch_size=chunk)


def link_members(alias: str, job: int, workflow: int) -> None:
    """Make ``job`` wait for every other job of ``workflow`` (a batch's callback), in one statement:
    a batch may hold more jobs than a statement may have parameters."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    edge, row = columns(Dependency, quote), columns(Job, quote)
    inserted = ", ".join(edge[name] for name in ("job", "upstream", "position", "upstream_state"))
    ended = ", ".join(["%s"] * len(ENDED))
    state, wf, pk, arg = (row[name] for name in ("state", "workflow", "id", "upstream_arg"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(Dependency._meta.db_table)} ({inserted}) "
            f"SELECT %s, {pk}, 0, CASE WHEN {state} IN ({ended}) THEN {state} ELSE '' END "
            # Not the batch's callbacks (what they are handed says so).
            f"FROM {quote(Job._meta.db_table)} WHERE {wf} = %s AND {pk} <> %s AND {arg} <> %s",
            [job, *ENDED, workflow, job, COUNTS],
        )
