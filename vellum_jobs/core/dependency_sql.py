"""The statements run after every outcome batch of workflow steps, written out per database.

The ORM's building of them (an ``IN`` of a few hundred ids, three
subqueries) cost several times what the database spends running them.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any, NamedTuple

from django.db import models

from vellum_jobs.core import transitions
from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency

BAD = (transitions.FAILED, transitions.CANCELLED)


def columns(model: type[models.Model], quote: Callable[[str], str]) -> dict[str, str]:
    """The quoted column of each of ``model``'s fields, by field name."""
    return {field.name: quote(str(field.column)) for field in model._meta.concrete_fields}


class Statements(NamedTuple):
    """The two statements; ``{ids}`` stands for the ids' placeholders."""

    # The ended jobs' edges take their end state, if the job is still in it.
    mark: str
    # ``dependencies._movable`` of the jobs waiting for the ended ones.
    movable: str


# Per database vendor: the statements differ only in how names are quoted.
_written: dict[str, Statements] = {}


def of(connection: Any) -> Statements:
    """The statements for ``connection``'s database."""
    if connection.vendor not in _written:
        _written[connection.vendor] = _statements(connection.vendor, connection.ops.quote_name)
    return _written[connection.vendor]


def _statements(vendor: str, quote: Callable[[str], str]) -> Statements:
    """Each statement finds its rows through the ids given, whatever the batch's size: MariaDB
    runs an ``IN (subquery)`` in an UPDATE as a scan of every edge (locking each), and probes a
    job's edges by the (job, upstream) key, all of a batch's callback's, unless told the index."""
    edge, row = columns(Dependency, quote), columns(Job, quote)
    edges, jobs = quote(Dependency._meta.db_table), quote(Job._meta.db_table)
    pk, state, run_if = row["id"], row["state"], row["run_if"]
    waiter, waits_for, ended = edge["job"], edge["upstream"], edge["upstream_state"]
    waits = f" FORCE INDEX ({quote('vellum_dependency_waits')})" if vendor == "mysql" else ""

    def an_edge(condition: str) -> str:
        return f"EXISTS (SELECT 1 FROM {edges} e{waits} WHERE e.{waiter} = j.{pk} AND e.{ended} {condition})"

    # One equality per bad end: each is one probe of the index on MariaDB too.
    unended, ended_badly = an_edge("= ''"), "(" + " OR ".join(an_edge("= %s") for _ in BAD) + ")"
    mark = (
        f"UPDATE {edges} SET {ended} = %s WHERE {waits_for} IN ({{ids}}) AND EXISTS "
        f"(SELECT 1 FROM {jobs} j WHERE j.{pk} = {edges}.{waits_for} AND j.{state} = %s)"
    )
    if vendor == "postgresql":
        # Driven from the jobs: the edges of a batch enqueued a moment ago have
        # no statistics yet, and PostgreSQL would scan them all for the ids.
        mark = (
            f"UPDATE {edges} e SET {ended} = %s FROM {jobs} j "
            f"WHERE j.{pk} IN ({{ids}}) AND j.{state} = %s AND e.{waits_for} = j.{pk}"
        )
    movable = (
        f"SELECT j.{pk} FROM {jobs} j WHERE j.{state} = %s "
        f"AND j.{pk} IN (SELECT {waiter} FROM {edges} WHERE {waits_for} IN ({{ids}})) "
        f"AND (NOT {unended} OR (j.{run_if} = %s AND {ended_badly}))"
    )
    return Statements(mark=mark, movable=movable)


def placeholders(values: Sized) -> str:
    """A placeholder for each of ``values``."""
    return ", ".join(["%s"] * len(values))
