"""How job values look in the admin: state badges, progress bars, durations, times and JSON.

Everything returned here is HTML built with ``format_html``, so values from
job arguments, results and errors are always escaped. Colours live in
``static/vellum_jobs/admin.css`` as classes, not inline styles, so a
Content-Security-Policy without ``unsafe-inline`` still shows them.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.formats import number_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

EMPTY = "-"
# JSON longer than this (in characters, indented) opens folded on the job
# page, so a large argument or result does not push the rest out of sight.
FOLD_JSON_OVER = 2_000


def badge(kind: str, text: str) -> SafeString:
    """A coloured label; ``kind`` picks the colour (a job state, or alive/stale)."""
    return format_html('<span class="vellum-badge vellum-badge-{}">{}</span>', kind, text)


def progress_bar(done: int | None, total: int | None, message: str = "") -> SafeString:
    """A bar for ``done`` of ``total`` with the numbers beside it; without a total, just the count."""
    if done is None:
        return format_html("{}", EMPTY)
    if total:
        percent = max(0, min(100, round(100 * done / total)))
        return format_html(
            '<span class="vellum-progress" title="{}"><progress max="{}" value="{}">{}%</progress> '
            "{}/{} ({}%)</span>",
            message,
            total,
            max(0, min(done, total)),
            percent,
            done,
            total,
            percent,
        )
    # An unknown total: an indeterminate bar (no value) and the count so far.
    return format_html(
        '<span class="vellum-progress" title="{}"><progress></progress> {}</span>', message, done
    )


def duration(value: timedelta | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 5 s``, ``2 h 3 min``, ``3 d 4 h``."""
    if value is None:
        return EMPTY
    seconds = max(0.0, value.total_seconds())
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s"


def moment(value: datetime | None) -> str:
    """A datetime in the current time zone, to the second."""
    if value is None:
        return EMPTY
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def when(verb: str, value: datetime | None, shown: str = "") -> SafeString:
    """A short time for the list: ``shown``, or the clock time today, the date and minute otherwise.

    The tooltip says ``verb`` and the full time, and ``datetime`` holds it for scripts.
    """
    if value is None:
        return format_html("{}", EMPTY)
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    today = (timezone.localtime() if timezone.is_aware(value) else datetime.now()).date()
    short = shown or local.strftime("%H:%M:%S" if local.date() == today else "%b %d %H:%M")
    return format_html(
        '<time class="vellum-when" datetime="{}" title="{} {}">{}</time>',
        local.isoformat(),
        verb,
        moment(value),
        short,
    )


def moment_and_age(value: datetime | None, now: datetime) -> SafeString:
    """A time to the second, and how long ago or ahead it is: ``2026-05-01 14:02:11 (3 min ago)``."""
    if value is None:
        return format_html("{}", EMPTY)
    gap = (now - value).total_seconds()
    words = (
        "now" if abs(gap) < 1 else f"{duration(timedelta(seconds=abs(gap)))} {'ago' if gap > 0 else 'ahead'}"
    )
    return format_html('<time datetime="{}">{}</time> ({})', value.isoformat(), moment(value), words)


def cut(text: str, kind: str = "") -> SafeString:
    """``text`` on one line, cut with an ellipsis where its column ends, whole in the tooltip."""
    if not text:
        return format_html("{}", EMPTY)
    classes = f"vellum-cut {kind}" if kind else "vellum-cut"
    return format_html('<span class="{}" title="{}">{}</span>', classes, text, text)


def pretty_json(value: object) -> SafeString:
    """``value`` as indented JSON in a ``<pre>`` block, folded under its size when it is long."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=repr)
    block = format_html('<pre class="vellum-pre">{}</pre>', text)
    if len(text) <= FOLD_JSON_OVER:
        return block
    lines = text.count("\n") + 1
    return format_html(
        '<details class="vellum-json"><summary>{} characters of JSON, {} lines</summary>{}</details>',
        number_format(len(text), force_grouping=True),
        number_format(lines, force_grouping=True),
        block,
    )


def preformatted(text: str) -> SafeString:
    """Text whose line breaks and indentation matter, such as a traceback."""
    if not text:
        return format_html("{}", EMPTY)
    return format_html('<pre class="vellum-pre vellum-error">{}</pre>', text)


def attempt_table(entries: list[dict[str, object]]) -> SafeString:
    """``Job.attempt_errors`` as a table, newest first: each attempt's end, worker, times and error."""
    if not entries:
        return format_html("{}", "none")
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        '<td><details><summary>{}</summary><pre class="vellum-pre vellum-error">{}</pre></details></td></tr>',
        (
            (
                entry.get("attempt", ""),
                entry.get("outcome", ""),
                entry.get("worker") or entry.get("worker_id") or EMPTY,
                _iso_moment(entry.get("started_at")),
                _seconds(entry.get("duration")),
                entry.get("error", ""),
                entry.get("traceback", ""),
            )
            for entry in reversed(entries)
        ),
    )
    return format_html(
        '<table class="vellum-attempts"><thead><tr><th>attempt</th><th>ended</th><th>worker</th>'
        "<th>started</th><th>took</th><th>error</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


def _iso_moment(value: object) -> str:
    return moment(datetime.fromisoformat(value)) if isinstance(value, str) else EMPTY


def _seconds(value: object) -> str:
    return duration(timedelta(seconds=value)) if isinstance(value, int | float) else EMPTY
