"""What ``explain()`` says of a queued job's rate and concurrency limits and the holds on its keys.

A job the worker held back (its limits had no room when it was about to
start) is queued again with ``run_after`` at its next slot and an error
that says so ("held by rate limit 'customer:42' (100 per minute): next slot
at ..."); that line leads. Then each of its limits as it stands now, read
for the page's jobs at once (``observe.limits.of_jobs``): a rate's starts in
its last period and, when full, its next slot; a concurrency limit's
running jobs; a hold on one of its keys, until when and why.

Codes: ``limit_held`` (a hold on one of its keys), ``limit_full`` (one of
its limits is full, or the worker held it back and it waits for the next
slot it was given), ``limit_room`` (its limits have room: it starts under
them; said after the other reasons).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime

from django.db.models.functions import Left

from vellum_jobs.core.limit_models import CONCURRENCY, RATE
from vellum_jobs.core.limits import Limits
from vellum_jobs.core.models import Job
from vellum_jobs.observe import limits

# The characters of an error read to find the worker's "held by" line.
HELD_LINE_CHARS = 500


@dataclasses.dataclass
class LimitFacts:
    """The limits of a page's queued jobs as they stand, and the worker's word on the held ones."""

    use: dict[limits.Ident, limits.KeyLimit]
    holds: dict[str, limits.Hold]
    held_by: dict[int, str]  # job id -> the worker's "held by ..." line


def read(jobs: Sequence[Job], now: datetime) -> LimitFacts:
    """The facts for the queued jobs with limits among ``jobs``: a few queries for them all."""
    gated = [job for job in jobs if job.state == Job.State.QUEUED and job.limits]
    if not gated:
        return LimitFacts({}, {}, {})
    alias = gated[0]._state.db or "default"
    use, holds = limits.of_jobs(alias, now, [Limits.decode(job.limits) for job in gated])
    rows = Job.objects.using(alias).filter(pk__in=[job.pk for job in gated])
    rows = rows.filter(error__startswith=limits.HELD_PREFIX)
    held_by = {
        pk: text.splitlines()[0] for pk, text in rows.values_list("pk", Left("error", HELD_LINE_CHARS))
    }
    return LimitFacts(use, holds, held_by)


def reason(job: Job, facts: LimitFacts, now: datetime, when: Callable[[datetime], str],
           in_words: Callable[[float], str]) -> tuple[str, str, tuple[int, ...]] | None:  # fmt: skip
    """(code, text, job ids named) of ``job``'s limits; None for a job without any."""
    job_limits = Limits.decode(job.limits)
    if not job_limits:
        return None

    def at(moment: datetime) -> str:
        return f"{when(moment)} (in {in_words((moment - now).total_seconds())})"

    keys = job_limits.keys()
    held = [facts.holds[key] for key in keys if key in facts.holds]
    parts = [f"{h.key!r} is held until {at(h.until)}" + (f": {h.reason}" if h.reason else "") for h in held]
    full = False
    ids: list[int] = []
    for limit in _limits_of(job_limits, facts):
        full = full or limit.full
        ids += limit.holders if limit.full else ()
        parts.append(_part(limit, at))
    said = facts.held_by.get(job.pk, "")
    if said and job.run_after > now:
        said += f"; it is tried again at {at(job.run_after)}"
    if held:
        code, lead = "limit_held", "held back by its limits"
    elif full or (said and job.run_after > now):
        code, lead = "limit_full", "held back by its limits"
    else:
        return "limit_room", "its limits have room: " + "; ".join(parts), tuple(ids)
    text = f"{said}; now: {'; '.join(parts)}" if said else f"{lead}: {'; '.join(parts)}"
    return code, text, tuple(ids)


def _limits_of(job_limits: Limits, facts: LimitFacts) -> list[limits.KeyLimit]:
    """The job's limits as they stand, each with the job's own N."""
    found = []
    wanted = [((k, RATE, p), n) for k, n, p in job_limits.rates]
    wanted += [((k, CONCURRENCY, 0.0), n) for k, n in job_limits.concurrency]
    for ident, n in wanted:
        now = facts.use.get(ident) or limits.KeyLimit(*ident)
        found.append(dataclasses.replace(now, count=n))
    return found


def _part(limit: limits.KeyLimit, at: Callable[[datetime], str]) -> str:
    """A limit in words: "rate 'k' is full: 100 of 100 per minute used, next slot at ...",
    "concurrency 'gpu': 0 of 1 running"."""
    if not limit.full:
        return f"{limit.kind} {limit.key!r}: {limit.use_text}"
    text = f"{limit.kind} {limit.key!r} is full: {limit.use_text}"
    if limit.next_free is not None:
        return f"{text}, next slot at {at(limit.next_free)}"
    if limit.holders:
        return f"{text} ({', '.join(f'#{pk}' for pk in limit.holders)})"
    return text
