"""The Limits page: each rate and concurrency limit key in use, how full it is, and what waits on it.

A row per limit of a key (a key may have a rate of 10 per second and one of
500 per hour, and a concurrency limit): its kind, its size, its use (a
rate's starts in its last period, a concurrency limit's running jobs,
linked), a full rate limit's next slot, the key's hold (``Throttled``)
until when and why, and the queued jobs that start under the key. Held
keys and full ones with jobs waiting come first, then the most waited on.
The figures are ``observe.limits``'s: a few bounded queries, whatever the
tables hold; at most ``SHOWN`` keys are listed, and the page says how many
more there are.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import django
from django.contrib.admin.utils import quote
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.formats import number_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.admin import display
from vellum_jobs.observe import limits

# The keys the page lists at most.
SHOWN = 200


@dataclasses.dataclass(frozen=True)
class Row:
    """One limit of a key, or a key's hold alone; the key's cells span its rows (``span``, 0 on the
    rows after its first)."""

    key: limits.KeyView
    limit: limits.KeyLimit | None
    span: int
    use: SafeString | str
    next_slot: SafeString | str


def rows(overview: limits.Overview, site: str) -> list[Row]:
    """The page's rows, of its first ``SHOWN`` keys."""
    found = []
    for key in overview.keys[:SHOWN]:
        each: list[limits.KeyLimit | None] = list(key.limits) or [None]
        for n, limit in enumerate(each):
            use = _use(limit, site) if limit else display.EMPTY
            next_slot = (
                display.moment_and_age(limit.next_free, overview.now) if limit and limit.next_free else ""
            )
            found.append(Row(key, limit, len(each) if n == 0 else 0, use, next_slot))
    return found


def _use(limit: limits.KeyLimit, site: str) -> SafeString | str:
    """The use in words, the running jobs linked: "1 of 2 running (#12)"."""
    if not limit.holders:
        return limit.use_text
    links = format_html_join(
        ", ",
        '<a href="{}">#{}</a>',
        ((reverse(f"{site}:vellum_jobs_job_change", args=[quote(pk)]), pk) for pk in limit.holders),
    )
    return format_html("{} ({})", limit.use_text, links)


def hold_text(hold: limits.Hold | None, now: datetime) -> SafeString | str:
    if hold is None:
        return ""
    shown = display.moment_and_age(hold.until, now)
    return format_html("{}: {}", shown, hold.reason) if hold.reason else shown


def context(alias: str, site: str) -> dict[str, Any]:
    """What the page shows of the limits on ``alias``; links point into the admin ``site``."""
    overview = limits.overview(alias)
    return {
        "overview": overview,
        "rows": [(row, hold_text(row.key.hold, overview.now)) for row in rows(overview, site)],
        "left_out": max(0, len(overview.keys) - SHOWN),
        "waiting_read": number_format(overview.waiting_read, force_grouping=True),
        "breadcrumbs_as_list": django.VERSION >= (6, 0),
    }


def view(request: HttpRequest, admin_context: dict[str, Any], alias: str, site: str) -> HttpResponse:
    list_url = reverse(f"{site}:vellum_jobs_job_changelist")
    figures = {**admin_context, **context(alias, site), "title": "Limits", "list_url": list_url}
    return TemplateResponse(request, "admin/vellum_jobs/job/limits.html", figures)
