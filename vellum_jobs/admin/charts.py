"""The dashboard's charts, drawn on the server as inline SVG: no script, no CDN, readable offline.

``bars`` stacks each step's outcome counts; ``line`` draws one figure per
step, with gaps where a step has none. Both scale to their largest value,
label it and the span's two ends, and give every bar a ``<title>`` that a
browser shows on hover.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from vellum_jobs.store.rollup import Bucket

WIDTH, HEIGHT = 720, 140  # the drawing's units; the SVG scales to its box
LEFT, BOTTOM = 44, 18  # room for the axis labels

# Outcome colours, the same as the state badges'.
COLOURS = {
    "done": "#1c7f3b",
    "retried": "#d08a00",
    "lost": "#6b46c1",
    "failed": "#ba2121",
    "cancelled": "#8a6100",
}


def bars(
    buckets: Sequence[Bucket], title: str, ends: tuple[str, str], outcomes: Sequence[str] = tuple(COLOURS)
) -> SafeString:
    """Stacked bars of each step's outcome counts, the outcomes in ``outcomes`` order from the bottom."""
    top = max([sum(b.counts[o] for o in outcomes) for b in buckets] + [0])
    step = (WIDTH - LEFT) / max(len(buckets), 1)
    rects = []
    for i, bucket in enumerate(buckets):
        y = float(HEIGHT - BOTTOM)
        for outcome in outcomes:
            n = bucket.counts[outcome]
            if not n:
                continue
            height = n / top * (HEIGHT - BOTTOM - 8)
            y -= height
            rects.append(
                (LEFT + i * step, y, max(step - 1, 0.5), height, COLOURS[outcome], outcome, n, bucket)
            )
    body = format_html_join(
        "",
        '<rect class="vellum-bar" data-outcome="{}" x="{}" y="{}" width="{}" height="{}" '
        'fill="{}"><title>{} {}: {}</title></rect>',
        (
            (outcome, _n(x), _n(y), _n(w), _n(h), colour, _clock(bucket.start), outcome, n)
            for x, y, w, h, colour, outcome, n, bucket in rects
        ),
    )
    return _svg(title, ends, body, _number(top), empty=not rects)


def line(buckets: Sequence[Bucket], title: str, ends: tuple[str, str]) -> SafeString:
    """The oldest due job's age per step, in seconds; a step without a sample breaks the line."""
    ages = [b.oldest_due_age for b in buckets]
    top = max([a for a in ages if a is not None] + [0.0])
    step = (WIDTH - LEFT) / max(len(buckets) - 1, 1)
    runs: list[list[str]] = [[]]
    for i, age in enumerate(ages):
        if age is None:
            runs.append([])
            continue
        y = HEIGHT - BOTTOM - (age / top * (HEIGHT - BOTTOM - 8) if top else 0)
        runs[-1].append(f"{LEFT + i * step:.1f},{y:.1f}")
    body = format_html_join(
        "",
        '<polyline class="vellum-line" points="{}" fill="none" stroke="#1d62d6" stroke-width="2"/>',
        ((" ".join(points),) for points in runs if points),
    )
    return _svg(title, ends, body, _seconds(top), empty=not any(runs))


def _svg(title: str, ends: tuple[str, str], body: SafeString, top: str, empty: bool) -> SafeString:
    first, last = ends
    axis = format_html(
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>'
        '<text x="{}" y="12" text-anchor="end">{}</text>'
        '<text x="{}" y="{}" text-anchor="end">0</text>'
        '<text x="{}" y="{}">{}</text><text x="{}" y="{}" text-anchor="end">{}</text>',
        LEFT, HEIGHT - BOTTOM, WIDTH, HEIGHT - BOTTOM,
        LEFT - 4, top,
        LEFT - 4, HEIGHT - BOTTOM,
        LEFT, HEIGHT - 4, first, WIDTH, HEIGHT - 4, last,
    )  # fmt: skip
    note = format_html(
        '<text x="{}" y="{}" text-anchor="middle">no data yet</text>', (WIDTH + LEFT) / 2, HEIGHT / 2
    )
    return format_html(
        '<svg class="vellum-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" '
        'xmlns="http://www.w3.org/2000/svg"><title>{}</title>{}{}</svg>',
        WIDTH, HEIGHT, title, title, axis, note if empty else body,
    )  # fmt: skip


def legend(outcomes: Sequence[str] = tuple(COLOURS)) -> SafeString:
    return format_html_join(
        "",
        '<span class="vellum-legend"><span style="background:{}"></span>{}</span>',
        ((COLOURS[o], o) for o in outcomes),
    )


def _clock(moment: datetime) -> str:
    # With USE_TZ = False the rollup's minutes are naive, in local time already.
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return local.strftime("%H:%M")


def _n(value: float) -> str:
    """A coordinate, to a tenth of a unit."""
    return f"{value:.1f}"


def _number(n: int) -> str:
    return f"{n:,}"


def _seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
