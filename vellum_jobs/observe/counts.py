"""Counts by state that stay cheap on a big table: exact while cheap, else "about" or "more than".

``Job.objects.stats()`` counts every row, which on a million finished jobs
takes longer than the rest of the page. Here each state is counted through
the ``vellum_job_state`` index, reading at most ``COUNT_LIMIT + 1`` entries (ten thousand).
A state with more rows than that is shown as the database planner's estimate
("about 950,000", from the statistics ANALYZE keeps on PostgreSQL and
MariaDB/MySQL), or as "more than 10,000" where there is none (SQLite).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet
from django.utils.formats import number_format

from vellum_jobs.core.models import Job

logger = logging.getLogger("vellum_jobs")

# Index entries read per state before the count becomes an estimate.
COUNT_LIMIT = 10_000


@dataclasses.dataclass(frozen=True)
class StateCount:
    state: str
    count: int
    # "exact", "about" (a planner estimate) or "more than" (a lower bound).
    precision: str = "exact"

    @property
    def text(self) -> str:
        number = number_format(self.count, force_grouping=True)
        return number if self.precision == "exact" else f"{self.precision} {number}"


def by_state(jobs: QuerySet[Job], limit: int = COUNT_LIMIT) -> list[StateCount]:
    """One ``StateCount`` per state, in the order of ``Job.State``."""
    counts = []
    for state in Job.State.values:
        rows = jobs.filter(state=state).order_by()
        n = rows[: limit + 1].count()
        if n <= limit:
            counts.append(StateCount(state, n))
            continue
        estimate = planner_estimate(rows)
        if estimate is not None and estimate > limit:
            counts.append(StateCount(state, estimate, "about"))
        else:
            counts.append(StateCount(state, limit, "more than"))
    return counts


def planner_estimate(rows: QuerySet[Job]) -> int | None:
    """The number of rows the database expects ``rows`` to have, from its statistics; None if unknown."""
    vendor = connections[rows.db].vendor
    try:
        if vendor == "postgresql":
            plan = json.loads(rows.explain(format="json"))
            return int(plan[0]["Plan"]["Plan Rows"])
        if vendor == "mysql":
            return _mysql_rows(json.loads(rows.explain(format="json")))
    except (DatabaseError, ValueError, KeyError, IndexError, TypeError) as exc:
        logger.debug("no row estimate error=%r", exc)
    return None


def _mysql_rows(plan: Any) -> int | None:
    # MySQL says "rows_examined_per_scan", MariaDB "rows"; both under the table
    # node. Through mysqlclient the plan can arrive as JSON inside a string.
    if isinstance(plan, str):
        return _mysql_rows(json.loads(plan))
    if isinstance(plan, dict):
        table = plan.get("table")
        if isinstance(table, dict):
            for key in ("rows_examined_per_scan", "rows"):
                if key in table:
                    return int(table[key])
        for value in plan.values():
            found = _mysql_rows(value)
            if found is not None:
                return found
    elif isinstance(plan, list):
        for value in plan:
            found = _mysql_rows(value)
            if found is not None:
                return found
    return None
