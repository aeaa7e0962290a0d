"""A job's upstream and downstream jobs as the read side shows them: what a waiting job still waits
for, and the links on a job's page.

Both read ``Dependency`` rows through their indexes and look up the jobs at
the other end for their names and states. What a waiting job waits for
reads only the edges whose end is not recorded yet (``upstream_state``
empty: the ``vellum_dependency_waits`` index), so a batch's callback behind
20,000 jobs, most of them ended, reads the few that are not; and a window
function numbers and counts those in the database, so at most ``SHOWN`` ids
per job come back, however many there are. An edge whose upstream job has
ended but whose end the release duty has not written yet is left out: the
job no longer waits for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from django.db.models import Count, F, QuerySet, Window
from django.db.models.functions import RowNumber

from vellum_jobs.core.models import Job
from vellum_jobs.core.workflow_models import Dependency

# The states of a job that has not ended.
UNFINISHED = (Job.State.WAITING, Job.State.QUEUED, Job.State.RUNNING)
# Ids named before "and N more".
SHOWN = 5


@dataclasses.dataclass(frozen=True)
class WaitingFor:
    """The upstream jobs a waiting job still waits for: the first few ids and how many in all."""

    ids: tuple[int, ...]
    total: int

    @property
    def text(self) -> str:
        """``#12``, ``#12 and #13``, ``#12, #13 and #14``, ``#1, #2, #3, #4, #5 and 7 more``."""
        return listed([f"#{pk}" for pk in self.ids], self.total)


def listed(items: Sequence[str], total: int) -> str:
    """``items`` joined as a sentence says them; ``and N more`` for those of ``total`` not among them."""
    rest = total - len(items)
    if rest > 0:
        return f"{', '.join(items)} and {rest} more"
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def waiting_for(jobs: Sequence[Job]) -> dict[int, WaitingFor]:
    """For each waiting job among ``jobs``, its upstream jobs that have not ended, in one query.

    A waiting job whose upstream jobs have all ended (its release is due) has
    no entry.
    """
    waiting = [job.pk for job in jobs if job.state == Job.State.WAITING]
    if not waiting:
        return {}
    alias = jobs[0]._state.db or "default"
    rows = (
        Dependency.objects.using(alias)
        .filter(job_id__in=waiting, upstream_state="", upstream__state__in=UNFINISHED)
        .annotate(
            total=Window(Count("pk"), partition_by=F("job_id")),
            place=Window(RowNumber(), partition_by=F("job_id"), order_by=F("upstream_id").asc()),
        )
        .filter(place__lte=SHOWN)
        .order_by("job_id", "upstream_id")
        .values_list("job_id", "upstream_id", "total")
    )
    ids: dict[int, list[int]] = {}
    totals: dict[int, int] = {}
    for job_id, upstream_id, total in rows:
        ids.setdefault(job_id, []).append(upstream_id)
        totals[job_id] = total
    return {job_id: WaitingFor(tuple(found), totals[job_id]) for job_id, found in ids.items()}


@dataclasses.dataclass(frozen=True)
class Linked:
    """A job at the other end of an edge; ``name`` and ``state`` empty when it was deleted."""

    id: int
    name: str
    state: str
    # The state the edge recorded for an upstream job ('' until it ended, and for a downstream one).
    ended_as: str = ""

    @property
    def deleted(self) -> bool:
        return not self.state


@dataclasses.dataclass(frozen=True)
class Links:
    """The first jobs at the other ends of a job's edges, and how many there are by state.

    ``by_state`` is read only when there are more jobs than ``shown``; a
    deleted job is in ``total`` but in no state.
    """

    shown: list[Linked]
    total: int
    by_state: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def more(self) -> int:
        return self.total - len(self.shown)


def upstream_of(job: Job, limit: int = 10) -> Links:
    """The jobs ``job`` waits for, in the order of their results (``position``)."""
    edges = Dependency.objects.using(job._state.db).filter(job_id=job.pk)
    rows = edges.order_by("position", "upstream_id").values_list("upstream_id", "upstream_state")
    return _links(edges, list(rows[: limit + 1]), limit, "upstream")


def downstream_of(job: Job, limit: int = 10) -> Links:
    """The jobs that wait for ``job``, by id."""
    edges = Dependency.objects.using(job._state.db).filter(upstream_id=job.pk)
    rows = [(pk, "") for pk in edges.order_by("job_id").values_list("job_id", flat=True)[: limit + 1]]
    return _links(edges, rows, limit, "job")


def _links(edges: QuerySet[Dependency], rows: list[tuple[int, str]], limit: int, end: str) -> Links:
    """The jobs of ``rows`` (id, recorded end) as ``Linked``; counted by state past ``limit``."""
    ids = [pk for pk, _ in rows[:limit]]
    found = {
        pk: (name, state)
        for pk, name, state in Job.objects.using(edges.db)
        .filter(pk__in=ids)
        .values_list("pk", "name", "state")
    }
    shown = [Linked(pk, *found.get(pk, ("", "")), ended_as=ended) for pk, ended in rows[:limit]]
    if len(rows) <= limit:
        return Links(shown, len(shown))
    # Grouped through the join: a deleted job is in the total and in no state.
    counted = dict(edges.order_by().values_list(f"{end}__state").annotate(n=Count("pk")))
    by_state = {state: counted.get(state, 0) for state in Job.State.values}
    return Links(shown, edges.count(), by_state)
