"""What failed and why: each listed job's error line, and the latest failures grouped by name and error.

The error column can hold a whole traceback (up to ``MAX_PAYLOAD_BYTES``),
so the list never loads it: ``attach`` reads only its last characters, for
the page's jobs, in one query, and keeps the last line, which names the
exception. Grouping reads the latest ``GROUP_LIMIT`` failed jobs newest first
through an index (``latest``), never the whole table, and the page says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.db.models.functions import Right

from vellum_jobs.core import history
from vellum_jobs.core.models import Job

# Characters read from the end of an error: enough for its last line.
TAIL_CHARS = history.SUMMARY_CHARS + 100
# Failed jobs the grouping reads, newest first.
GROUP_LIMIT = 1_000
# A traceback's last line names the exception: "smtplib.SMTPRecipientsRefused: {...}".
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# Where ``attach`` leaves a job's error line for the list's column to read.
_ATTRIBUTE = "_vellum_error_line"

# The jobs each grouping reads: parameters of the job list, and what the page calls them.
KINDS: dict[str, tuple[str, dict[str, str]]] = {
    "failed": ("failed jobs", {"state__exact": Job.State.FAILED}),
    "retrying": ("jobs waiting to retry after a failed attempt", {"retrying": "yes"}),
}


def retrying(queryset: QuerySet[Job]) -> QuerySet[Job]:
    """The queued jobs whose last attempt failed, waiting for their next one.

    A snooze (``Retry``) leaves no error and gives its attempt back, so it is not among them.
    """
    return queryset.filter(state=Job.State.QUEUED, attempts__gt=0).exclude(error="")


def attach(jobs: Iterable[Job]) -> None:
    """Give each of ``jobs`` that may have an error its error line, reading only the errors' ends."""
    wanted = {job.pk: job for job in jobs if job.state != Job.State.RUNNING}
    if not wanted:
        return
    alias = next(iter(wanted.values()))._state.db or "default"
    rows = Job.objects.using(alias).filter(pk__in=wanted).exclude(error="")
    lines = dict(rows.values_list("pk", Right("error", TAIL_CHARS)))
    for pk, job in wanted.items():
        setattr(job, _ATTRIBUTE, history.summary(lines.get(pk) or ""))


def line_of(job: Job) -> str:
    """The last line of ``job``'s error ("" without one), as ``attach`` left it or read now."""
    found: str | None = getattr(job, _ATTRIBUTE, None)
    if found is None:
        found = "" if "error" in job.get_deferred_fields() else history.summary(job.error)
    return found


def kind_of(line: str) -> str:
    """What failures are grouped by: the exception's name, or the text before the first colon."""
    if match := _EXCEPTION.match(line):
        return match[1]
    return line.split(":", 1)[0].strip()[:100]


def latest(queryset: QuerySet[Job], kind: str, limit: int) -> QuerySet[Job, tuple[Any, ...]]:
    """The newest ``limit`` jobs of ``kind``: id, name, finished_at and the end of the error.

    Newest first by id, so an index serves it walking backwards, without a
    sort, and stops at the ``limit`` th match: the state index ``(state, id)``,
    or the primary key where most jobs are of that state.
    """
    rows = retrying(queryset) if kind == "retrying" else queryset.filter(state=Job.State.FAILED)
    return rows.order_by("-id").values_list("id", "name", "finished_at", Right("error", TAIL_CHARS))[:limit]


@dataclasses.dataclass
class Group:
    name: str
    kind: str
    count: int
    example: str  # the newest one's error line
    newest_id: int
    newest_at: datetime | None
    url: str


@dataclasses.dataclass
class Grouping:
    kind: str
    described: str
    groups: list[Group]
    read: int  # jobs read
    complete: bool  # all of them: fewer than GROUP_LIMIT matched


def group(
    queryset: QuerySet[Job], kind: str, list_url: str, params: dict[str, str], *, limit: int
) -> Grouping:
    """The latest ``limit`` jobs of ``kind`` (a key of ``KINDS``) among ``queryset``, by name and error.

    Each group links to ``list_url`` filtered to its jobs; ``params`` are the list's other
    filters (the queue), kept in those links.
    """
    described, selects = KINDS[kind]
    found: dict[tuple[str, str], Group] = {}
    read = 0
    for pk, name, finished_at, tail in latest(queryset, kind, limit):
        read += 1
        line = history.summary(tail or "")
        key = (name, kind_of(line))
        if key in found:
            found[key].count += 1
            continue
        query: dict[str, Any] = {**params, **selects, "name": name}
        if key[1]:
            query["error"] = key[1]
        found[key] = Group(name, key[1], 1, line, pk, finished_at, f"{list_url}?{urlencode(query)}")
    groups = sorted(found.values(), key=lambda g: (-g.count, -g.newest_id))
    return Grouping(kind, described, groups, read, read < limit)
